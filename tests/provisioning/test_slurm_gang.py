"""Multi-node gangs on the `slurm` backend, against a real 6-node Slurm cluster of its own (devcluster/slurm_cluster.py,
two leaf switches of three nodes in a topology.conf, fake-device GRES): a 2-node order in one rack becomes ONE Slurm
job of two nodes under one switch, its record lists both nodes with the GPUs Slurm bound on each, release cancels the
job, and a member node drained before the job starts takes the whole gang back to the queue with its reason: it
runs again on two nodes Slurm starts work on, never half; a card of a running member isolated requeues the whole gang
and cancels its job."""

import re
from types import SimpleNamespace

import pytest

from catalog.choices import TopologyLevel, TopologyMode
from catalog.models import Vendor
from metering.books.services import slurm_books_reconcile
from metering.models import SlurmBooks
from provisioning.choices import RunKind, RunState
from provisioning.models import ProvisioningRun
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.orders import Order
from scheduling import cycle
from scheduling import services as scheduling_services
from scheduling.choices import AllocationState, ExecutionBackend
from scheduling.models import Allocation, Device, Rack, Site
from scheduling.slurm.api import SlurmApi
from scheduling.slurm.topology import expand_hostlist
from tests import factories
from tests.devcluster_fixtures import cluster_for_tests
from tests.provisioning.conftest import add_node
from tests.provisioning.test_slurm_backend import eventually, in_state, job_state
from tests.provisioning.test_slurm_books import SECONDS_APART, ended_books

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture(scope="module")
def gang_cluster():
    """Six nodes (gpu:a100:2 each) under two leaf switches, with Slurm's books, for this module only: the session's
    cluster is unchanged."""
    with cluster_for_tests(node_count=6, leaf_switches=2, name_prefix="gang", accounting=True) as cluster:
        yield cluster


@pytest.fixture
def gangs(gang_cluster, settings, team, run_on_commit, django_capture_on_commit_callbacks):
    """The platform pointed at the gang cluster, its six nodes in the inventory (one rack per leaf switch), a spec of
    2 nodes x 2 A100 in one rack, and order helpers. Every job is cancelled and every node resumed afterwards."""
    cluster = gang_cluster
    settings.SLURM_REST_URL, settings.SLURM_USER_NAME = cluster.rest_url, cluster.user_name
    settings.SLURM_JWT, settings.SLURM_JWT_FILE, settings.SLURM_CONF = cluster.token, "", str(cluster.slurm_conf)
    settings.SLURM_JOB_DIRECTORY, settings.SLURM_PARTITION = str(cluster.job_dir), cluster.partition
    nvidia = Vendor.objects.get(slug="nvidia")
    accelerator = factories.AcceleratorModelFactory(vendor=nvidia, slug=cluster.node_shape.gpu_type, name="A100 80GB")
    site = Site.objects.create(name="gang-site")
    for switch, names in cluster.switches.items():
        rack = Rack.objects.create(site=site, name=switch)
        for name in names:
            add_node(
                accelerator,
                name=name,
                cards=cluster.node_shape.gpus,
                cpu_cores=cluster.node_shape.cpus,
                memory_gb=cluster.node_shape.real_memory_mib // 1024,
                execution_backend=ExecutionBackend.SLURM,
                rack=rack,
            )
    spec = factories.ResourceSpecFactory(
        accelerator_models=[accelerator],
        accelerator_count=2,
        cpu_cores=2,
        memory_gb=4,
        node_count=2,
        topology_level=TopologyLevel.RACK,
        topology_mode=TopologyMode.REQUIRED,
    )
    image = factories.ImageFactory(compatible_vendors=[nvidia])
    service = factories.ServiceFactory(specs=[spec], images=[image])

    def submit():
        """Queued, without the cycle its submission triggers after the commit."""
        return request_services.request_submit(
            order=Order(service=service, project=team.project, duration_hours=1, spec=spec, image=image),
            requester=team.developer,
        )

    def placed_then(request, change):
        """The scheduler places the gang; `change(member nodes)` happens in Slurm before provisioning starts; then
        what the cycle's commit starts runs, as in production."""
        with django_capture_on_commit_callbacks() as after_the_cycle:
            cycle.run_cycle()
        change(list(Allocation.objects.filter(request=request).order_by("member").values_list("node__name", flat=True)))
        run_on_commit(lambda: [callback() for callback in after_the_cycle])

    with SlurmApi.from_settings() as api:
        yield SimpleNamespace(
            cluster=cluster, api=api, submit=submit, placed_then=placed_then, run_on_commit=run_on_commit
        )
    cluster.reset()


def delivered(request) -> dict:
    return ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION, state=RunState.SUCCEEDED).delivered


def job_nodes_detail(cluster, job_id: int) -> dict[str, str]:
    """`scontrol show job -d`: each node of the job with the GRES Slurm bound on it (nodes bound alike share a line,
    as a host list)."""
    shown = cluster.scontrol("show", "job", "-d", str(job_id))
    lines = re.findall(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\d+ GRES=(\S+)", shown)
    return {node: bound for nodes, bound in lines for node in expand_hostlist(nodes)}


def num_nodes(cluster, job_id: int) -> int:
    return int(re.search(r"NumNodes=(\d+)", cluster.scontrol("show", "job", str(job_id))).group(1))


def switch_of(cluster, node: str) -> str:
    return next(switch for switch, names in cluster.switches.items() if node in names)


def test_a_two_node_order_runs_as_one_slurm_job_on_one_switch_and_release_cancels_it(gangs):
    request = gangs.submit()
    gangs.run_on_commit(cycle.run_cycle)

    assert in_state(request, RequestState.ACTIVE)
    members = list(Allocation.objects.filter(request=request).order_by("member"))
    assert [member.member for member in members] == [0, 1]
    assert len({switch_of(gangs.cluster, member.node.name) for member in members}) == 1
    assert ProvisioningRun.objects.filter(request=request).count() == 1  # one run, on the leader
    access = delivered(request)
    job_id = access["job_id"]
    assert job_state(gangs.api, job_id) == "RUNNING" and num_nodes(gangs.cluster, job_id) == 2
    per_node = job_nodes_detail(gangs.cluster, job_id)
    assert set(per_node) == {member.node.name for member in members}
    assert all(bound.startswith("gpu:a100:2(IDX:0-1)") for bound in per_node.values())
    assert access["num_nodes"] == 2 and access["access"] == {"attach": f"srun --jobid={job_id} --pty bash"}
    assert {member["node"]: member["bound_indexes"] for member in access["members"]} == {
        member.node.name: [0, 1] for member in members
    }
    job = gangs.api.job(job_id)
    assert (job["tres_per_node"], job["time_limit"]) == ("gres:gpu:a100:2", 60)
    assert all(member.workload_started_at and member.metered_from_workload for member in _fresh(members))
    assert {member.slurm_job_id for member in _fresh(members)} == {job_id}  # the one job is every member's

    gangs.run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")

    assert in_state(request, RequestState.RELEASED)
    assert eventually(lambda: job_state(gangs.api, job_id) == "CANCELLED")
    assert {member.state for member in _fresh(members)} == {AllocationState.RELEASED}
    assert not Device.objects.filter(allocated_milli__gt=0).exists()
    # Slurm's books hold the one job's four GPUs; the platform metered two on each member: the same card-hours.
    books = eventually(lambda: ended_books(job_id), seconds=30)
    assert books.gpus == 4
    assert slurm_books_reconcile().read == [request.pk]
    assert abs(SlurmBooks.objects.get(request=request).difference_card_hours) <= 4 * SECONDS_APART


def test_a_member_node_drained_before_the_job_starts_takes_the_whole_gang_back_to_the_queue(gangs):
    request = gangs.submit()
    drained = []

    def drain_the_second_member(nodes):
        drained.append(nodes[1])
        gangs.cluster.scontrol("update", f"nodename={nodes[1]}", "state=drain", "reason=cable swap")

    gangs.placed_then(request, drain_the_second_member)

    assert in_state(request, RequestState.ACTIVE)
    first, second = (
        list(Allocation.objects.filter(request=request, state=state).order_by("member"))
        for state in (AllocationState.RELEASED, AllocationState.ACTIVE)
    )
    assert len(first) == len(second) == 2  # the whole gang went back and came again, never half of it
    assert {member.release_reason.split(":")[0] for member in first} == {"placed again"}
    assert drained[0] not in {member.node.name for member in second}
    note = request.events.get(code=EventCode.PREEMPTED)
    assert f"Slurm has node {drained[0]} IDLE+DRAIN (cable swap)" in note.message
    assert "The whole gang of 2 nodes is placed again." in note.message
    assert note.data["code"] == "backend_node_unavailable"
    job_id = delivered(request)["job_id"]
    assert job_state(gangs.api, job_id) == "RUNNING" and num_nodes(gangs.cluster, job_id) == 2
    assert drained[0] not in job_nodes_detail(gangs.cluster, job_id)


def _fresh(allocations):
    return [Allocation.objects.get(pk=allocation.pk) for allocation in allocations]


def test_a_card_of_a_running_member_isolated_takes_the_whole_gang_back_and_cancels_its_job(gangs):
    request = gangs.submit()
    gangs.run_on_commit(cycle.run_cycle)
    assert in_state(request, RequestState.ACTIVE)
    first = list(Allocation.objects.filter(request=request).order_by("member"))
    job_id = delivered(request)["job_id"]
    card = first[1].devices.first().device

    gangs.run_on_commit(scheduling_services.device_isolate, device=card, reason="XID 79", actor=None)

    assert {member.state for member in _fresh(first)} == {AllocationState.RELEASED}  # both members, never one
    assert "a device of the allocation was isolated" in request.events.get(code=EventCode.PREEMPTED).message
    assert eventually(lambda: job_state(gangs.api, job_id) == "CANCELLED")
    again = Allocation.objects.filter(request=request, state=AllocationState.ACTIVE)
    assert again.count() == 2 and not again.filter(devices__device=card).exists()  # placed again as a whole gang
