"""Faults of the Slurm backend on the local cluster (devcluster/slurm_cluster.py), injected as an operator would meet
them: slurmctld stopped by PID for seconds and for about a minute, slurmrestd stopped, the database's connections
dropped under a real worker. Each ends with the same accounts: no order failed, no release failed, no node cordoned,
no job running on a card the books call free, no job submitted twice; while the fault lasts the waiting reason is on
the request (page and API) and in the order preview; once the backend is back everything converges.

Time: a real outage is as short as the scenario allows (slurmrestd answers only after about 9 s while slurmctld is
down); "about a minute" is the wall clock moved forward a minute during a real outage (time-machine), which is what
the platform's outage accounting reads. Nothing sleeps: every wait polls a condition against a deadline."""

import contextlib
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import time_machine
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import Schedule

from catalog.models import Vendor
from provisioning import engine, services
from provisioning.choices import RunKind, RunState, StepState, Wait
from provisioning.drivers.slurm import JOB_COMMENT, RUNNING, SlurmWorkloads, gpu_indexes, job_name
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.reconcile import workloads_reconcile
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.orders import Order
from scheduling import cycle
from scheduling.choices import AllocationState, ExecutionBackend
from scheduling.models import Allocation, BackendStatus, Device, Node
from scheduling.slurm.api import SlurmApi
from tests import factories
from tests.provisioning.conftest import add_node
from tests.provisioning.test_crash_safety import kill, start_worker
from tests.provisioning.test_slurm_backend import eventually, in_state, outside_job, slurm_target

pytestmark = pytest.mark.django_db

CONTROLLER_WAIT = "Waiting for the Slurm controller since "
RELEASE_WAIT = "Releasing — waiting for Slurm to confirm the job stopped: "


@pytest.fixture
def faults(settings, slurm_settings, team, run_on_commit, client):
    """The platform on the session's cluster: its three nodes (2 x a100 each) in the inventory, a one-GPU service,
    and what a fault test needs to order, release, drive the workers' schedules and read the accounts."""
    cluster = slurm_settings
    settings.SLURM_JOB_DIRECTORY = str(cluster.job_dir)
    settings.SLURM_PARTITION = cluster.partition
    settings.SLURM_TIMEOUT_SECONDS = 4.0  # slurmrestd waits ~9 s a call on a stopped slurmctld: no need to wait it out
    settings.PROVISIONING_CHAIN_SECONDS = 1.0  # a waiting step goes back to the sweeper (driven below) at once
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0.0
    settings.PROVISIONING_OUTAGE_RETRY_MAX_SECONDS = 0.5  # each sweep below asks a down backend again
    nvidia = Vendor.objects.get(slug="nvidia")
    accelerator = factories.AcceleratorModelFactory(vendor=nvidia, slug=cluster.node_shape.gpu_type, name="A100 80GB")
    spec = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=1, cpu_cores=2, memory_gb=4
    )
    image = factories.ImageFactory(compatible_vendors=[nvidia])
    service = factories.ServiceFactory(specs=[spec], images=[image])
    for name in cluster.node_names:
        add_node(
            accelerator,
            name=name,
            cards=cluster.node_shape.gpus,
            cpu_cores=cluster.node_shape.cpus,
            memory_gb=cluster.node_shape.real_memory_mib // 1024,
            execution_backend=ExecutionBackend.SLURM,
        )
    order = Order(service=service, project=team.project, duration_hours=1, spec=spec, image=image)
    client.force_login(team.developer)

    def submit():
        """Submitted and queued; the scheduler's cycle and everything after it run after the commit."""
        return run_on_commit(request_services.request_submit, order=order, requester=team.developer)

    def release(request):
        run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
        request.refresh_from_db()
        return request

    def sweep():
        """The minute sweeper, sooner: it hands out the due steps."""
        run_on_commit(engine.steps_resume_due)

    def running(request):
        """Ordered and active: its job RUNNING on the chosen node (the sweeper drives its readiness checks)."""
        eventually(lambda: sweep() or in_state(request, RequestState.ACTIVE), seconds=30, every=0.2)
        return request

    def converged(requests, released=()):
        """After a fault: the minute schedules, sooner (the reconciler asks the backends, which clears an outage and
        wakes the steps waiting for it; the sweeper), until the requests are where they should be."""
        run_on_commit(workloads_reconcile)
        sweep()
        return all(in_state(request, RequestState.ACTIVE) for request in requests) and all(
            in_state(request, RequestState.RELEASED) for request in released
        )

    with SlurmApi.from_settings() as api:
        # Slurm keeps finished jobs a while (MinJobAge) and the cluster is the session's: this test's come after these.
        before = max((job["job_id"] for job in api.jobs()), default=0)
        yield SimpleNamespace(
            cluster=cluster,
            api=api,
            jobs=lambda: [job for job in api.jobs() if job["job_id"] > before],
            order=order,
            submit=submit,
            release=release,
            sweep=sweep,
            converged=converged,
            running=running,
            client=client,
            run_on_commit=run_on_commit,
            preview=lambda: request_services.request_preview(order=order, requester=team.developer)["placement"],
        )


# --- The accounts every fault is held to ---------------------------------------------------------------------------


def assert_accounts(faults, requests) -> None:
    """No order or release failed, no node cordoned, no job of ours running on a card the books call free, and one
    job per allocation (none submitted twice), among the jobs of this test."""
    states = {request.pk: request.state for request in requests}
    assert RequestState.FAILED not in states.values(), states
    assert not ProvisioningRun.objects.filter(state=RunState.FAILED).exists()
    assert not Node.objects.filter(schedulable=False).exists(), list(Node.objects.values_list("cordon_reason"))
    ours = [(job, JOB_COMMENT.match(job.get("comment") or "")) for job in faults.jobs()]
    ours = [(job, int(named["allocation"])) for job, named in ours if named]
    for job, allocation_id in ours:
        if job["job_state"] != RUNNING:
            continue
        allocation = Allocation.objects.get(pk=allocation_id)
        assert allocation.state == AllocationState.ACTIVE, f"job {job['job_id']} runs for released #{allocation_id}"
        cards = Device.objects.filter(node__name=job["nodes"], index__in=gpu_indexes(job["gres_detail"]))
        assert all(card.allocated_milli > 0 for card in cards), f"job {job['job_id']} runs on a free card"
    per_allocation = [allocation_id for _, allocation_id in ours]
    assert len(per_allocation) == len(set(per_allocation)), "an allocation got two Slurm jobs"


def waiting_on_page(client, request) -> str:
    """The request page's outage notice, and the API's `provisioning.waiting`, which must say the same."""
    page = client.get(reverse("portal:request-detail", args=[request.pk])).content.decode()
    answer = client.get(f"/api/v1/requests/{request.pk}/").json()
    waiting = answer["provisioning"]["waiting"]
    assert f'id="backend-outage" data-code="{waiting["code"]}"' in page
    assert waiting["message"] in page.replace("&#x27;", "'")
    return waiting["message"]


def step_waiting_for_outage(request) -> ProvisioningStep | None:
    run = ProvisioningRun.objects.filter(request=request, state=RunState.RUNNING).order_by("-pk").first()
    step = run and run.steps.get(position=run.current_position)
    return step if step and step.state == StepState.WAITING and step.waiting_for == Wait.OUTAGE else None


def job_ids_of(faults, request) -> list[int]:
    return [job["job_id"] for job in faults.jobs() if job["name"] == job_name(request.pk)]


def fill_slurm_outside(api: SlurmApi, cluster) -> list[int]:
    """Jobs submitted to Slurm behind the platform's back on every GPU the platform's own jobs leave free: whatever
    node the platform picks next, Slurm holds that job pending (Resources)."""
    busy = {}
    for job in api.jobs():
        if job["job_state"] == RUNNING:
            busy[job["nodes"]] = busy.get(job["nodes"], 0) + len(gpu_indexes(job["gres_detail"]))
    return [
        outside_job(api, cluster, node, gpus=free)
        for node in cluster.node_names
        if (free := cluster.node_shape.gpus - busy.get(node, 0)) > 0
    ]


def held_in_slurm(faults):
    """An order in flight: submitted, its job held in Slurm by an operator (`scontrol hold`: it pends JobHeldAdmin)
    while the GPUs it waited for are free again, so that `scontrol release` lets it run at Slurm's next pass."""
    cluster = faults.cluster
    blockers = fill_slurm_outside(faults.api, cluster)
    request = faults.submit()
    assert in_state(request, RequestState.PROVISIONING)
    (job_id,) = job_ids_of(faults, request)
    cluster.scontrol("hold", str(job_id))
    cluster.scancel(*map(str, blockers))
    return request, job_id


def run_finished(run: ProvisioningRun, state: str) -> bool:
    run.refresh_from_db()
    return run.state == state


@contextlib.contextmanager
def controller_down(cluster):
    cluster.stop_controller()
    try:
        yield
    finally:
        if "slurmctld" not in cluster.daemon_groups:
            cluster.start_controller()


# --- slurmctld stopped ---------------------------------------------------------------------------------------------


def test_a_slurmctld_restart_of_seconds_fails_nothing_and_submits_nothing_twice(faults):
    """A release, an order whose job Slurm holds pending and a new order meet a slurmctld restart: the release waits
    for Slurm to confirm the job stopped (its devices held meanwhile), the pending order waits for the controller,
    the new order waits in the queue for the backend; Slurm's first answers after the restart (submissions accepted
    with error 2068 while the nodes register) end nothing."""
    cluster = faults.cluster
    releasing = faults.running(faults.submit())
    pending, held = held_in_slurm(faults)

    with controller_down(cluster):
        faults.release(releasing)
        assert releasing.state == RequestState.RELEASING
        assert waiting_on_page(faults.client, releasing).startswith(RELEASE_WAIT + "the Slurm controller has not")
        assert Allocation.objects.get(request=releasing).state == AllocationState.ACTIVE  # the job may still run
        assert BackendStatus.objects.get(backend="slurm").unavailable
        queued = faults.submit()
        queued.refresh_from_db()
        assert (queued.state, queued.queue_reason["code"]) == (RequestState.QUEUED, "backend_unavailable")
        assert queued.queue_reason["message"].startswith("Slurm controller unreachable since ")
        assert queued.queue_reason["message"].endswith(": new orders wait.")
        assert faults.preview()["message"] == queued.queue_reason["message"]
        eventually(lambda: faults.sweep() or step_waiting_for_outage(pending), seconds=40)
        assert waiting_on_page(faults.client, pending).startswith(CONTROLLER_WAIT)

    faults.converged([pending, queued], released=[releasing])  # the first answers, while the nodes register
    cluster.wait_until_nodes_respond()
    cluster.scontrol("release", str(held))
    eventually(lambda: faults.converged([pending, queued], released=[releasing]), seconds=60, every=0.5)

    assert not BackendStatus.objects.get(backend="slurm").unavailable
    assert_accounts(faults, [releasing, pending, queued])
    assert all(len(job_ids_of(faults, request)) == 1 for request in (releasing, pending, queued))
    assert releasing.events.filter(code=EventCode.BACKEND_WAIT, data__code="backend_answered").exists()
    assert faults.client.get(f"/api/v1/requests/{pending.pk}/").json()["provisioning"]["waiting"] is None


def test_slurmctld_down_for_a_minute_is_waited_out_not_failed(faults, settings):
    """The wall clock moves a minute during a real outage: far past the old 14 s of retries and past the readiness
    check's own timeout (60 s here), which the outage does not eat into; nothing fails, and the job Slurm accepted
    before the outage is the job the order keeps."""
    settings.PROVISIONING_STEP_TIMEOUTS = {"readiness_check": 60}
    cluster = faults.cluster
    pending, held = held_in_slurm(faults)

    with time_machine.travel(timezone.now(), tick=True) as clock:
        with controller_down(cluster):
            eventually(lambda: faults.sweep() or step_waiting_for_outage(pending), seconds=40)
            clock.shift(timedelta(seconds=61))
            faults.sweep()  # asks again: still down, still waiting
            step = step_waiting_for_outage(pending)
            assert step is not None and timezone.now() - step.outage_since > timedelta(seconds=60)
            assert waiting_on_page(faults.client, pending).startswith(CONTROLLER_WAIT)
        cluster.wait_until_nodes_respond()
        cluster.scontrol("release", str(held))
        eventually(lambda: faults.converged([pending]), seconds=60, every=0.5)

    assert job_ids_of(faults, pending) == [held]
    readiness = ProvisioningStep.objects.get(run__request=pending, name="readiness_check")
    assert readiness.attempts == 1  # waiting for the controller is no attempt of the step's own
    assert_accounts(faults, [pending])


def test_an_outage_longer_than_the_budget_fails_the_order_clearly_and_its_cleanup_waits(faults, settings):
    """Past PROVISIONING_OUTAGE_BUDGET_SECONDS an order fails with the backend's words, no node is cordoned, and the
    cleanup waits for Slurm to cancel the job with the devices held; once Slurm answers they go back."""
    settings.PROVISIONING_OUTAGE_BUDGET_SECONDS = 30
    cluster = faults.cluster
    fill_slurm_outside(faults.api, cluster)
    pending = faults.submit()
    assert in_state(pending, RequestState.PROVISIONING)

    with time_machine.travel(timezone.now(), tick=True) as clock:
        with controller_down(cluster):
            eventually(lambda: faults.sweep() or step_waiting_for_outage(pending), seconds=40)
            clock.shift(timedelta(seconds=31))
            eventually(lambda: faults.sweep() or in_state(pending, RequestState.FAILED), seconds=40)
            failure = ProvisioningRun.objects.get(request=pending, kind=RunKind.PROVISION).failure
            assert (failure["step"], failure["code"]) == ("readiness_check", "slurm_unavailable")
            assert failure["message"].startswith("The Slurm controller did not answer for ")
            assert not Node.objects.filter(schedulable=False).exists()
            eventually(lambda: faults.sweep() or step_waiting_for_outage(pending), seconds=40)  # the cleanup's
            assert Allocation.objects.get(request=pending).state == AllocationState.ACTIVE
            assert waiting_on_page(faults.client, pending).startswith("Cleaning up — waiting for Slurm to confirm")
        cleanup = ProvisioningRun.objects.get(request=pending, kind=RunKind.CLEANUP)
        eventually(lambda: faults.sweep() or run_finished(cleanup, RunState.SUCCEEDED), seconds=60, every=0.5)

    assert Allocation.objects.get(request=pending).state == AllocationState.RELEASED
    assert faults.api.job(job_ids_of(faults, pending)[0])["job_state"] == "CANCELLED"
    assert not Node.objects.filter(schedulable=False).exists()


def test_a_submission_slurm_accepts_with_an_error_after_a_restart_is_the_job_and_never_submitted_again(faults):
    """Right after slurmctld starts again, before its nodes register, Slurm answers a submission with error 2068
    (required node not available) and a job id: it accepted the job, which pends ReqNodeNotAvail and then runs. The
    step keeps it (Slurm's error as a warning); a retried step finds it by name and comment instead of submitting."""
    cluster = faults.cluster
    target = slurm_target(cluster, cluster.node_names[0], 636363, gpus=1)
    image = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {}}
    cluster.stop_controller()
    cluster.start_controller()

    started = SlurmWorkloads().start_workload(target, image)
    again = SlurmWorkloads().start_workload(target, image)

    assert started["submitted"] and [error["error_code"] for error in started["slurm_warnings"]] == [2068]
    assert (again["submitted"], again["job_id"]) == (False, started["job_id"])
    assert eventually(lambda: faults.api.job(started["job_id"])["job_state"] == RUNNING, seconds=30)


# --- slurmrestd stopped --------------------------------------------------------------------------------------------


def test_slurmrestd_stopped_holds_orders_and_releases_until_it_answers(faults):
    cluster = faults.cluster
    releasing = faults.running(faults.submit())

    cluster.stop_rest()
    try:
        faults.release(releasing)
        assert waiting_on_page(faults.client, releasing).startswith(RELEASE_WAIT + "slurmrestd has not answered")
        queued = faults.submit()
        queued.refresh_from_db()
        assert queued.queue_reason["code"] == "backend_unavailable"
        assert queued.queue_reason["message"].startswith("slurmrestd unreachable since ")
    finally:
        cluster.start_rest()
    eventually(lambda: faults.converged([queued], released=[releasing]), seconds=60, every=0.5)

    assert_accounts(faults, [releasing, queued])
    assert not Allocation.objects.filter(request=releasing, state=AllocationState.ACTIVE).exists()


# --- The database's connections dropped ----------------------------------------------------------------------------


# The worker's sessions carry this application name (libpq reads PGAPPNAME), so that the drops below end them alone:
# the test process's other sessions (the session's live server, say) are not the platform under test.
WORKER_APPLICATION = "fault-test-worker"


def drop_database_connections() -> int:
    """What a PostgreSQL restart or failover does to the worker's sessions (pg_terminate_backend)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
            [WORKER_APPLICATION],
        )
        return cursor.fetchone()[0]


def through_drops(condition, *, seconds: float, log: Path) -> int:
    """Drop the worker's connections at once (the tasks of what was just asked for are in flight; again at each
    look until a drop has cut a session: a worker just started may not have connected yet) and then once more while a
    step is running, driving the minute schedule (cycle and sweeper) meanwhile, until `condition()` holds; how many
    of the drops terminated sessions."""
    deadline, dropped = time.monotonic() + seconds, bool(drop_database_connections())
    again = True
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not converged in {seconds} s after {dropped} drops; worker log:\n{log.read_text()[-3000:]}")
        if not dropped:
            dropped = bool(drop_database_connections())
        elif again and ProvisioningStep.objects.filter(state=StepState.RUNNING).exists():
            dropped += bool(drop_database_connections())
            again = False
        cycle.run_cycle()  # the minute schedule's: a cycle cut by a drop before its commit placed nothing
        engine.steps_resume_due()
        services.runs_start_stranded()  # the minute sweeper: a start lost with a dropped session
        services.releases_resume_stranded()  # and a release's
        time.sleep(0.3)
    return dropped


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_dropped_database_connections_under_a_real_worker_fail_nothing(faults, monkeypatch, tmp_path, settings):
    """A real qcluster (two workers, the ORM broker) provisions four orders and releases two while every database
    session of the worker is terminated as the orders are placed and as the releases are asked for, and again while a
    step runs: the steps whose record was lost are taken over once their short lease lapses, a release whose teardown
    task was lost is resumed, and the accounts balance."""
    cluster = faults.cluster
    settings.PROVISIONING_RELEASE_GRACE_SECONDS = 2  # the sweeper below resumes a release whose task was lost
    settings.PROVISIONING_START_GRACE_SECONDS = 2  # and starts the runs of an allocation whose start was lost
    monkeypatch.setattr(Conf, "SYNC", False)  # this process enqueues; the worker runs the tasks
    Schedule.objects.all().delete()  # the sweeper is driven below, as its schedule would
    log = tmp_path / "worker.log"
    worker = start_worker(
        log,
        Q_WORKERS="2",
        PGAPPNAME=WORKER_APPLICATION,
        PROVISIONING_LEASE_SECONDS="2",
        SLURM_REST_URL=cluster.rest_url,
        SLURM_USER_NAME=cluster.user_name,
        SLURM_JWT=cluster.token,
        SLURM_CONF=str(cluster.slurm_conf),
        SLURM_PARTITION=cluster.partition,
        SLURM_JOB_DIRECTORY=str(cluster.job_dir),
    )
    try:
        requests = [faults.submit() for _ in range(4)]
        provisioning_drops = through_drops(
            lambda: all(in_state(request, RequestState.ACTIVE) for request in requests), seconds=120, log=log
        )
        released = [faults.release(request) for request in requests[:2]]
        release_drops = through_drops(
            lambda: all(in_state(request, RequestState.RELEASED) for request in released), seconds=120, log=log
        )
    finally:
        kill(worker)

    assert provisioning_drops >= 1 and release_drops >= 1
    assert_accounts(faults, requests)
    assert all(len(job_ids_of(faults, request)) == 1 for request in requests)
    assert not Allocation.objects.filter(request__in=released, state=AllocationState.ACTIVE).exists()
