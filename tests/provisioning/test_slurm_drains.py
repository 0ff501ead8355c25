"""Drains seen within seconds, against the local Slurm cluster (devcluster/slurm_cluster.py, drained with scontrol):
Slurm's node states reach the inventory within one refresh and at once from the answer of a step that met them; a
node Slurm starts no work on gets no placements; work placed on it just before the drain is placed again elsewhere
(with the reason on its timeline) or waits in the queue with its reason until Slurm resumes the node, never failed;
the resume lifts the cordon and places the queue at once."""

from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.urls import reverse

from catalog.models import Vendor
from metering.selectors import request_usage
from provisioning import engine
from provisioning.choices import RunKind, RunState
from provisioning.drivers import slurm
from provisioning.drivers.base import PlacementLost
from provisioning.drivers.slurm import SlurmWorkloads, job_name
from provisioning.models import ProvisioningRun
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.orders import Order
from scheduling import cycle, tasks
from scheduling.choices import AllocationState, ExecutionBackend, HealthSource
from scheduling.models import Allocation, HealthEvent, Node
from tests import factories
from tests.provisioning.conftest import add_node
from tests.provisioning.test_slurm_backend import (  # noqa: F401  (on_slurm is a fixture)
    eventually,
    in_state,
    job_state,
    on_slurm,
    outside_job,
    slurm_target,
)

pytestmark = pytest.mark.django_db

IMAGE = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {}}


@pytest.fixture
def pool(on_slurm, team, run_on_commit, django_capture_on_commit_callbacks):  # noqa: F811  (the imported fixture)
    """A one-GPU compute service on Slurm nodes the test adds to the inventory (`add`), and order helpers."""
    cluster = on_slurm.cluster
    nvidia = Vendor.objects.get(slug="nvidia")
    accelerator = factories.AcceleratorModelFactory(vendor=nvidia, slug=cluster.node_shape.gpu_type, name="A100 80GB")
    spec = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=1, cpu_cores=2, memory_gb=4
    )
    image = factories.ImageFactory(compatible_vendors=[nvidia])
    service = factories.ServiceFactory(specs=[spec], images=[image])

    def add(name: str) -> Node:
        return add_node(
            accelerator,
            name=name,
            cards=cluster.node_shape.gpus,
            cpu_cores=cluster.node_shape.cpus,
            memory_gb=cluster.node_shape.real_memory_mib // 1024,
            execution_backend=ExecutionBackend.SLURM,
        )

    def submit():
        """Queued, without the cycle its submission triggers after the commit."""
        return request_services.request_submit(
            order=Order(service=service, project=team.project, duration_hours=1, spec=spec, image=image),
            requester=team.developer,
        )

    def drained_after_placement(request, reason: str) -> Node:
        """The scheduler places the request; Slurm drains that node before provisioning starts (the inventory has
        not heard of it yet); then what the cycle's commit starts runs, as in production."""
        with django_capture_on_commit_callbacks() as after_the_cycle:
            cycle.run_cycle()
        node = Allocation.objects.get(request=request, state=AllocationState.ACTIVE).node
        cluster.scontrol("update", f"nodename={node.name}", "state=drain", f"reason={reason}")
        run_on_commit(lambda: [callback() for callback in after_the_cycle])
        return node

    return SimpleNamespace(
        add=add,
        submit=submit,
        drained_after_placement=drained_after_placement,
        cluster=cluster,
        api=on_slurm.api,
        run_on_commit=run_on_commit,
    )


def delivered(request) -> dict:
    """What the provisioning that succeeded delivered (a request placed again has had a cancelled one before)."""
    return ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION, state=RunState.SUCCEEDED).delivered


def never_failed(request) -> bool:
    return (
        not request.events.filter(code=EventCode.FAILED).exists()
        and not ProvisioningRun.objects.filter(request=request, state=RunState.FAILED).exists()
    )


def placed_again(request):
    return request.events.get(code=EventCode.PREEMPTED)


# --- Slurm -> inventory ----------------------------------------------------------------------------------------


def test_a_drain_reaches_the_inventory_at_the_next_refresh_and_the_resume_places_the_queue_at_once(
    pool, django_assert_max_num_queries
):
    node = pool.add(pool.cluster.node_names[0])
    pool.cluster.scontrol("update", f"nodename={node.name}", "state=drain", "reason=fan failure")

    assert pool.run_on_commit(tasks.refresh_slurm_node_states) == "1 cordoned, 0 uncordoned, 2 health events"

    node.refresh_from_db()
    assert (node.schedulable, node.cordon_reason) == (False, "Slurm reports the node IDLE+DRAIN: fan failure")
    assert set(HealthEvent.objects.filter(device__node=node, source=HealthSource.SLURM).values_list("value")) == {
        ("IDLE+DRAIN: fan failure",)
    }
    with django_assert_max_num_queries(1):  # nothing moved: one read, nothing written
        assert tasks.refresh_slurm_node_states() == "0 cordoned, 0 uncordoned, 0 health events"

    request = pool.run_on_commit(pool.submit)
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED and request.queue_reason["code"] == "insufficient_healthy_capacity"

    pool.cluster.resume_all()
    pool.cluster.wait_for_node_state(node.name, "idle")
    pool.run_on_commit(tasks.refresh_slurm_node_states)  # no cycle is run by the test: the uncordon runs one

    node.refresh_from_db()
    assert node.schedulable
    assert in_state(request, RequestState.ACTIVE)
    assert pool.api.job(delivered(request)["job_id"])["nodes"] == node.name


def test_down_is_out_of_service_too_and_the_import_s_uncordon_places_the_queue_at_once(pool):
    node = pool.add(pool.cluster.node_names[2])
    pool.cluster.scontrol("update", f"nodename={node.name}", "state=down", "reason=PSU failed")
    pool.run_on_commit(tasks.refresh_slurm_node_states)
    request = pool.run_on_commit(pool.submit)
    assert in_state(request, RequestState.QUEUED)

    pool.cluster.resume_all()
    pool.cluster.wait_for_node_state(node.name, "idle")
    pool.run_on_commit(call_command, "import_inventory", "--from-slurm", stdout=StringIO())

    assert in_state(request, RequestState.ACTIVE)


def test_the_refresh_does_nothing_while_slurm_cannot_be_asked(pool, settings):
    node = pool.add(pool.cluster.node_names[0])
    settings.SLURM_REST_URL = "http://127.0.0.1:9"

    assert tasks.refresh_slurm_node_states().startswith("not read: slurmrestd at http://127.0.0.1:9 unreachable")
    node.refresh_from_db()
    assert node.schedulable
    settings.SLURM_REST_URL = ""
    assert tasks.refresh_slurm_node_states() == "Slurm not configured (SLURM_REST_URL is empty)"


# --- Work placed just before the drain ---------------------------------------------------------------------------


def test_an_order_on_a_node_drained_before_its_job_was_submitted_is_placed_on_another_node(pool, client):
    for name in pool.cluster.node_names[:2]:
        pool.add(name)
    request = pool.submit()

    drained = pool.drained_after_placement(request, "rack maintenance")

    assert in_state(request, RequestState.ACTIVE) and never_failed(request)
    job = pool.api.job(delivered(request)["job_id"])
    assert job["job_state"] == "RUNNING" and job["nodes"] != drained.name
    note = placed_again(request)
    assert note.message == (
        f"Slurm has node {drained.name} IDLE+DRAIN (rack maintenance) and starts no work there. Back in the queue, "
        "to be placed again where it can run."
    )
    assert note.data["code"] == "backend_node_unavailable" and note.data["step"] == "start_workload"
    drained.refresh_from_db()  # known at once, not at the next refresh: nothing is placed there again
    assert drained.cordon_reason == "Slurm reports the node IDLE+DRAIN: rack maintenance"
    first, second = Allocation.objects.filter(request=request).order_by("pk")
    assert (first.node, first.state, second.node.name) == (drained, AllocationState.RELEASED, job["nodes"])
    assert first.release_reason.startswith(f"placed again: Slurm has node {drained.name} IDLE+DRAIN")
    runs = ProvisioningRun.objects.filter(request=request).order_by("pk")
    assert [(run.kind, run.state) for run in runs] == [
        (RunKind.PROVISION, RunState.CANCELLED),
        (RunKind.TEARDOWN, RunState.SUCCEEDED),
        (RunKind.PROVISION, RunState.SUCCEEDED),
    ]
    client.force_login(request.requester)
    page = client.get(reverse("portal:request-detail", args=[request.pk])).content.decode()
    assert f"Slurm has node {drained.name} IDLE+DRAIN (rack maintenance)" in page


def test_with_no_other_node_the_order_waits_with_its_reason_until_slurm_resumes_the_node(pool, client):
    node = pool.add(pool.cluster.node_names[0])
    request = pool.submit()

    pool.drained_after_placement(request, "BIOS update")

    request.refresh_from_db()
    assert request.state == RequestState.QUEUED and never_failed(request)
    assert request.queue_reason["code"] == "insufficient_healthy_capacity"
    assert "BIOS update" in placed_again(request).message
    client.force_login(request.requester)
    shown = client.get(f"/api/v1/requests/{request.pk}/").json()
    assert (shown["state"], shown["queue"]["code"]) == ("queued", "insufficient_healthy_capacity")
    assert "BIOS update" in next(event for event in shown["timeline"] if event["code"] == "preempted")["message"]
    assert not [job for job in pool.api.jobs() if job["name"] == job_name(request.pk)]  # nothing was submitted

    pool.cluster.resume_all()
    # Right after a resume Slurm may still call the node NOT_RESPONDING until its next ping: a refresh then keeps
    # the cordon, the next one lifts it. The minute schedule does this; the test asks sooner.
    eventually(lambda: pool.run_on_commit(tasks.refresh_slurm_node_states) and Node.objects.get(pk=node.pk).schedulable)

    assert in_state(request, RequestState.ACTIVE) and never_failed(request)
    assert pool.api.job(delivered(request)["job_id"])["nodes"] == node.name


def test_a_job_pending_on_a_node_that_drains_is_placed_again_elsewhere(pool, settings):
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0  # the readiness poll goes back to the sweeper between checks
    first = pool.add(pool.cluster.node_names[0])
    blocker = outside_job(pool.api, pool.cluster, first.name, gpus=2)  # the platform's job waits behind it
    request = pool.run_on_commit(pool.submit)
    assert in_state(request, RequestState.PROVISIONING)
    job_id = ProvisioningRun.objects.get(request=request).steps.get(name="start_workload").output["job_id"]
    second = pool.add(pool.cluster.node_names[1])

    pool.cluster.scontrol("update", f"nodename={first.name}", "state=drain", "reason=DIMM errors")
    eventually(lambda: in_state(request, RequestState.ACTIVE) or pool.run_on_commit(engine.steps_resume_due) < 0, 60)

    assert never_failed(request)
    assert pool.api.job(delivered(request)["job_id"])["nodes"] == second.name
    note = placed_again(request)
    assert note.message.startswith(f"Slurm has node {first.name} ") and note.data["step"] == "readiness_check"
    assert note.message.endswith(
        f"+DRAIN (DIMM errors) and starts no work there (its job {job_id} was still pending). Back in the queue, to "
        "be placed again where it can run."
    )  # MIXED or ALLOCATED+DRAIN: the blocker still runs there
    assert eventually(lambda: job_state(pool.api, job_id) == "CANCELLED")  # the teardown took it back
    assert job_state(pool.api, blocker) == "RUNNING"  # what ran there before the drain keeps running


def test_a_submission_slurm_answers_with_node_not_available_is_placed_again(pool, monkeypatch):
    """The drain lands between the step's look-up of the node and the submission: Slurm's answer (errno 2068) names
    the node."""
    node = pool.add(pool.cluster.node_names[1])
    pool.cluster.scontrol("update", f"nodename={node.name}", "state=drain", "reason=reseating GPUs")
    monkeypatch.setattr(slurm, "_nodes_refusing", lambda api, targets: lambda target: None)  # read before the drain
    target = slurm_target(pool.cluster, node.name, 626262, gpus=1)

    [outcome] = SlurmWorkloads().start_workloads([(target, IMAGE)])

    # Slurm accepted the job all the same (with its job id) and holds it pending: the teardown that follows the
    # requeue cancels it.
    [held] = [job for job in pool.api.jobs() if job["name"] == job_name(626262)]
    assert (held["job_state"], held["state_reason"]) == ("PENDING", "ReqNodeNotAvail")
    assert isinstance(outcome, PlacementLost)
    assert outcome.reason["details"] == {
        "backend": "slurm",
        "node": node.name,
        "slurm_state": "IDLE+DRAIN",
        "slurm_reason": "reseating GPUs",
        "job_id": held["job_id"],
    }
    node.refresh_from_db()
    assert node.cordon_reason == "Slurm reports the node IDLE+DRAIN: reseating GPUs"
    assert SlurmWorkloads().stop_workload(target)["cancelled"] == [held["job_id"]]


def test_a_node_slurm_does_not_know_fails_its_runs_before_anything_is_submitted(pool):
    """The inventory names a node the cluster has not got: the submission step's look-up finds no such node, the run
    fails at once (not retried) and asks for the node to be isolated, and no job is submitted; the batch's other run,
    on a node Slurm knows, is submitted."""
    known = slurm_target(pool.cluster, pool.cluster.node_names[0], 626270, gpus=1)
    unknown = slurm_target(pool.cluster, "no-such-node", 626271, gpus=1)

    started, refused = SlurmWorkloads().start_workloads([(known, IMAGE), (unknown, IMAGE)])

    assert (refused.code, refused.retryable) == ("slurm_node_unknown", False)
    assert refused.details == {"isolate": True, "node": "no-such-node"}
    names = [job["name"] for job in pool.api.jobs()]
    assert job_name(626271) not in names and job_name(626270) in names
    assert SlurmWorkloads().stop_workload(known)["cancelled"] == [started["job_id"]]


def test_a_reservation_keeps_the_job_waiting_with_its_reason_rather_than_placing_it_again(pool):
    """ReqNodeNotAvail on a node Slurm has in service (reserved for others) is a wait, not a lost placement."""
    node = pool.add(pool.cluster.node_names[2])
    outside_job(pool.api, pool.cluster, node.name, gpus=2)  # the job waits, and so meets the reservation
    target = slurm_target(pool.cluster, node.name, 727272, gpus=1)
    [started] = SlurmWorkloads().start_workloads([(target, IMAGE)])
    reservation = ["reservationname=h38-maintenance", "starttime=now", "duration=10", f"nodes={node.name}"]
    pool.cluster.scontrol("create", "reservation", *reservation, "users=root", "flags=maint,ignore_jobs")
    try:
        pending = eventually(lambda: _waiting_for(target, started, "ReqNodeNotAvail"))
    finally:
        pool.cluster.scontrol("delete", "reservationname=h38-maintenance")

    assert pending.reason["code"] == "insufficient_healthy_capacity"
    assert Node.objects.get(pk=node.pk).schedulable


def _waiting_for(target, started: dict, slurm_reason: str):
    [outcome] = SlurmWorkloads().workloads_ready([(target, started)])
    assert not isinstance(outcome, PlacementLost | dict), outcome
    return outcome if (outcome.reason or {}).get("details", {}).get("slurm_reason") == slurm_reason else None


def test_a_job_that_never_started_is_charged_nothing(pool):
    pool.add(pool.cluster.node_names[0])
    request = pool.submit()

    pool.drained_after_placement(request, "firmware")

    request.refresh_from_db()
    [never_ran] = Allocation.objects.filter(request=request)
    assert never_ran.state == AllocationState.RELEASED and never_ran.workload_started_at is None
    assert request_usage(request)["card_hours"] == 0
