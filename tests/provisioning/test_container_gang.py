"""Multi-node gangs on the `container` backend, against this machine's podman (runc, images built locally from a
busybox-static Containerfile): a 2-node order runs as one container per member, each on its own node with its own
cards and the rendezvous environment torchrun expects; member 1 reaches member 0 at MASTER_ADDR:MASTER_PORT on the
gang's network; release removes both. A member that cannot start takes the others down with it, and a card of a
running member isolated takes the whole gang back to the queue, and one member's container ending ends the gang:
never half a gang."""

import os
import shutil
import stat
import time
from types import SimpleNamespace

import pytest

from catalog.choices import TopologyLevel, TopologyMode
from catalog.demo import workspace_schema
from catalog.models import Vendor
from provisioning.choices import RunKind, RunState
from provisioning.drivers.container import Podman
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.reconcile import workloads_reconcile
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.orders import Order
from scheduling import cycle
from scheduling import services as scheduling_services
from scheduling.choices import AllocationState, ExecutionBackend
from scheduling.models import Allocation, Device, Rack, Site
from tests import factories
from tests.devcluster_fixtures import podman_service  # noqa: F401  (fixture)
from tests.provisioning.conftest import add_node

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

# What each member runs: a stand-in for sshd's identification line (the readiness probe), and on member 0 a listener
# at the rendezvous port that names itself, as a launcher's store would answer there.
START = """\
while true; do echo SSH-2.0-gang-test | /bin/busybox nc -l -p 22; done &
if [ "$NODE_RANK" = 0 ]; then
  while true; do echo "member 0 of $NNODES" | /bin/busybox nc -l -p "$MASTER_PORT"; done &
fi
wait
"""


@pytest.fixture
def gang(podman_service, team, run_on_commit, django_capture_on_commit_callbacks, settings, tmp_path):  # noqa: F811
    """Two container nodes of 4 cards in one rack, a spec of 2 nodes x 2 cards in one rack with a busybox image, and
    order helpers. Every container of the test is removed at the end."""
    context = tmp_path / "images" / "gang"
    context.mkdir(parents=True)
    shutil.copy(shutil.which("busybox"), context / "busybox")
    (context / "start").write_text(START)
    (context / "Containerfile").write_text(
        'FROM scratch\nCOPY busybox /bin/busybox\nCOPY start /start\nCMD ["/bin/busybox", "sh", "/start"]\n'
    )
    settings.CONTAINER_IMAGE_DIR, settings.CONTAINER_IMAGE_CACHE = str(context.parent), str(tmp_path / "cache")
    settings.CONTAINER_PODMAN_URL = podman_service.url
    settings.CONTAINER_ACCESS_HOST = settings.CONTAINER_PUBLISH_IP = "127.0.0.1"
    settings.CONTAINER_DEVICE_PATH = podman_service.device_path
    settings.CONTAINER_INSTANCE = podman_service.instance
    settings.PROVISIONING_MAX_ATTEMPTS = 2
    nvidia = Vendor.objects.get(slug="nvidia")
    accelerator = factories.AcceleratorModelFactory(vendor=nvidia, slug="h100-80gb", name="H100 80GB")
    rack = Rack.objects.create(site=Site.objects.create(name="podman-site"), name="r1")
    for name in ("podman-1", "podman-2"):
        add_node(
            accelerator, name=name, cpu_cores=4, memory_gb=8, rack=rack, execution_backend=ExecutionBackend.CONTAINER
        )
    spec = factories.ResourceSpecFactory(
        accelerator_models=[accelerator],
        accelerator_count=2,
        cpu_cores=1,
        memory_gb=1,
        node_count=2,
        topology_level=TopologyLevel.RACK,
        topology_mode=TopologyMode.REQUIRED,
    )
    image = factories.ImageFactory(reference="containerfile:gang", compatible_vendors=[nvidia])
    service = factories.ServiceFactory(parameter_schema=workspace_schema(), specs=[spec], images=[image])

    def placed_then(change):
        """Order the gang; the scheduler places it; `change(member nodes)` happens before provisioning starts; then
        what the cycle's commit starts runs, as in production."""
        order = Order(
            service=service,
            project=team.project,
            duration_hours=1,
            spec=spec,
            image=image,
            parameters={"ssh_public_key": podman_service.key.public, "jupyter": False},
        )
        request = request_services.request_submit(order=order, requester=team.developer)
        with django_capture_on_commit_callbacks() as after_the_cycle:
            cycle.run_cycle()
        change(list(Allocation.objects.filter(request=request).order_by("member").values_list("node__name", flat=True)))
        run_on_commit(lambda: [callback() for callback in after_the_cycle])
        request.refresh_from_db()
        return request

    podman = Podman(podman_service.url)
    yield SimpleNamespace(placed_then=placed_then, podman=podman, run_on_commit=run_on_commit)
    for container in podman.containers():
        podman.run("rm", "--force", "--time", "0", container["Id"])


def _containers_by_node(podman: Podman, request) -> dict[str, dict]:
    members = Allocation.objects.filter(request=request).values_list("pk", "node__name")
    by_allocation = {str(pk): node for pk, node in members}
    return {
        by_allocation[container["Labels"]["compute-catalog.allocation"]]: podman.inspect(container["Id"])
        for container in podman.containers(f"compute-catalog.request={request.pk}")
    }


def _reached(podman: Podman, name: str, address: str, port: str) -> str:
    """What member 0's listener answers a connection from container `name` (its loop listens again at once)."""
    answer = ""
    for _ in range(20):
        answer = podman.run("exec", name, "/bin/busybox", "nc", "-w", "5", address, port).strip()
        if answer:
            break
        time.sleep(0.2)
    return answer


def test_a_two_node_gang_runs_one_container_per_member_that_meet_at_the_rendezvous_and_release_removes_both(gang):
    request = gang.placed_then(lambda nodes: None)

    assert request.state == RequestState.ACTIVE, list(
        ProvisioningStep.objects.filter(run__request=request).values_list("name", "error")
    )
    assert ProvisioningRun.objects.filter(request=request).count() == 1  # one run, on the leader
    members = list(Allocation.objects.filter(request=request).order_by("member").select_related("node"))
    assert [member.member for member in members] == [0, 1]
    containers = _containers_by_node(gang.podman, request)
    assert set(containers) == {"podman-1", "podman-2"}
    leader_name = f"request-{request.pk}-node-0"
    for rank, member in enumerate(members):
        container = containers[member.node.name]
        assert container["State"]["Running"]
        environment = dict(variable.split("=", 1) for variable in container["Config"]["Env"])
        assert {key: environment[key] for key in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK")} == {
            "MASTER_ADDR": leader_name,
            "MASTER_PORT": "29500",
            "NNODES": "2",
            "NODE_RANK": str(rank),
        }
        assert (environment["NPROC_PER_NODE"], environment["WORLD_SIZE"], environment["PET_NNODES"]) == ("2", "4", "2")
        bound = sorted(member.devices.values_list("device__index", flat=True))
        assert [device["PathInContainer"] for device in container["HostConfig"]["Devices"]] == [
            f"/dev/nvidia{index}" for index in bound
        ]
        assert (container["HostConfig"]["NanoCpus"], container["HostConfig"]["Memory"]) == (10**9, 2**30)

    follower = containers[members[1].node.name]["Name"]
    assert _reached(gang.podman, follower, leader_name, "29500") == "member 0 of 2"

    delivered = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION, state=RunState.SUCCEEDED).delivered
    assert delivered["num_nodes"] == 2
    assert [(member["member"], member["node"]) for member in delivered["members"]] == [
        (member.member, member.node.name) for member in members
    ]
    assert delivered["rendezvous"]["MASTER_ADDR"] == leader_name and delivered["rendezvous"]["leader_address"]
    assert all(member.workload_started_at for member in Allocation.objects.filter(request=request))

    gang.run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")

    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert gang.podman.containers(f"compute-catalog.request={request.pk}") == []
    assert set(Allocation.objects.filter(request=request).values_list("state", flat=True)) == {AllocationState.RELEASED}
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_a_member_that_cannot_start_takes_the_others_down_and_the_gang_fails_as_one(gang, settings, tmp_path):
    """Member 1's node lost its device nodes after placement: podman refuses its container, member 0's is removed
    again, the step is tried again as one and, out of attempts, the request fails with nothing left running."""
    devices = tmp_path / "dev"

    def only_the_leader_has_devices(nodes):
        (devices / nodes[0]).mkdir(parents=True)
        for index in range(4):
            os.mknod(devices / nodes[0] / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        settings.CONTAINER_DEVICE_PATH = str(devices / "{node}" / "nvidia{index}")

    request = gang.placed_then(only_the_leader_has_devices)

    assert request.state == RequestState.FAILED
    step = ProvisioningStep.objects.get(run__request=request, run__kind=RunKind.PROVISION, name="start_workload")
    assert step.attempts == 2 and step.error["code"] == "podman_failed"
    assert gang.podman.containers(f"compute-catalog.request={request.pk}") == []
    # Each attempt started member 0's container, and removed it when member 1's could not start.
    removed = gang.podman.run(
        *("events", "--stream=false", "--since", "10m", "--format", "{{.Status}} {{.Name}}"),
        *("--filter", f"label=compute-catalog.request={request.pk}"),
    ).split()
    leader = f"{settings.CONTAINER_INSTANCE}-request-{request.pk}-allocation-{step.run.allocation_id}"
    assert [line for line in zip(removed[::2], removed[1::2], strict=True) if line == ("remove", leader)] == [
        ("remove", leader)
    ] * 2
    assert set(Allocation.objects.filter(request=request).values_list("state", flat=True)) == {AllocationState.RELEASED}
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_a_card_of_a_running_member_isolated_takes_the_whole_gang_back_to_the_queue_and_it_runs_again(gang):
    request = gang.placed_then(lambda nodes: None)
    assert request.state == RequestState.ACTIVE
    first = list(Allocation.objects.filter(request=request).order_by("member"))
    before = {container["Id"] for container in gang.podman.containers(f"compute-catalog.request={request.pk}")}
    card = first[1].devices.first().device

    gang.run_on_commit(scheduling_services.device_isolate, device=card, reason="XID 79: fell off the bus", actor=None)

    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE  # placed again, on healthy cards, and running
    assert {allocation.state for allocation in Allocation.objects.filter(pk__in=[a.pk for a in first])} == {
        AllocationState.RELEASED
    }  # both members went back, never one of them
    note = request.events.get(code=EventCode.PREEMPTED)
    assert "a device of the allocation was isolated" in note.message
    again = Allocation.objects.filter(request=request, state=AllocationState.ACTIVE)
    assert again.count() == 2 and not again.filter(devices__device=card).exists()
    after = {container["Id"] for container in gang.podman.containers(f"compute-catalog.request={request.pk}")}
    assert len(after) == 2 and not after & before  # the old members' containers removed, two new ones run


def test_a_member_container_that_ends_by_itself_ends_the_whole_gang(gang):
    """Member 1's container is killed: the reconciler fails the request and the cleanup removes member 0's
    container too, freeing every member's cards."""
    request = gang.placed_then(lambda nodes: None)
    assert request.state == RequestState.ACTIVE
    follower = Allocation.objects.get(request=request, member=1)
    name = f"{gang.podman.containers(f'compute-catalog.allocation={follower.pk}')[0]['Names'][0]}"
    gang.podman.run("kill", "--signal", "KILL", name)  # its main process killed: the container stops, code 137
    gang.podman.run("wait", name, timeout=30)

    assert gang.run_on_commit(workloads_reconcile) == {request.pk: "failed"}

    request.refresh_from_db()
    assert request.state == RequestState.FAILED
    failure = request.events.get(code="failed").data["failure"]
    assert failure["code"] == "workload_failed" and failure["details"]["node"] == follower.node.name
    assert gang.podman.containers(f"compute-catalog.request={request.pk}") == []
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}
