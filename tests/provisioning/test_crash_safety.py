"""Crash safety with real worker processes: a `qcluster` killed mid-step leaves a short lease that lapses (the step's
timeout is far longer); another worker resumes the run from that step, runs no completed step again, and leaves no
orphan allocation. A step that works longer than the lease keeps it: its heartbeat renews it."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule, Task
from django_q.tasks import async_task

from provisioning import engine
from provisioning.choices import StepState
from provisioning.drivers.simulated import SimulatedHost
from provisioning.models import ProvisioningRun, ProvisioningStep
from requests import services as request_services
from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling import cycle
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device
from tests.provisioning.conftest import add_node
from tests.requests.conftest import make_order
from tests.requests.test_concurrency import in_own_connection

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

REPO = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 2  # far shorter than start_workload's 600 s timeout: a dead worker's step lapses after the lease


def start_worker(log: Path, **extra_env: str) -> subprocess.Popen:
    """A real `manage.py qcluster` on the test database, in its own process group (so it can be killed whole)."""
    database = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "Q_SYNC": "0",
        "Q_WORKERS": "1",
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
        "PROVISIONING_SIMULATED_SPEED": "0.1",
        "PROVISIONING_LEASE_SECONDS": str(LEASE_SECONDS),
        **extra_env,
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def wait_for(condition, *, seconds: float, what: str, log: Path | None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    worker_log = f" Worker log:\n{log.read_text()[-3000:]}" if log else ""
    pytest.fail(f"Timed out waiting for {what}.{worker_log}")


def lease_lapsed(step_id: int) -> bool:
    """Asked of the database's clock, which the sweeper's comparison uses too."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_expires_at < now() FROM provisioning_provisioningstep WHERE id = %s", [step_id])
        return cursor.fetchone()[0]


def kill(worker: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group may have exited already
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)


def test_a_worker_killed_mid_step_is_replaced_without_repeating_steps(shop, team, monkeypatch, settings, tmp_path):
    monkeypatch.setattr(Conf, "SYNC", False)  # this process enqueues into the broker; the workers run the tasks
    settings.PROVISIONING_LEASE_SECONDS = LEASE_SECONDS
    add_node(shop.accelerator)
    request = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    log = tmp_path / "worker.log"
    first = start_worker(log)
    try:
        cycle.run_cycle()  # allocates; provisioning starts in the worker
        step = wait_for(
            lambda: ProvisioningStep.objects.filter(name="start_workload", state=StepState.RUNNING).first(),
            seconds=60,
            what="start_workload to be running",
            log=log,
        )
    finally:
        kill(first)
    assert ProvisioningStep.objects.get(pk=step.pk).state == StepState.RUNNING  # the dead worker's lease remains
    assert step.timeout_seconds == 600

    wait_for(
        lambda: lease_lapsed(step.pk), seconds=10 * LEASE_SECONDS, what="the dead worker's lease to lapse", log=log
    )
    second = start_worker(tmp_path / "worker2.log")
    try:
        assert engine.steps_resume_due() == 1  # the sweeper hands the expired step to the new worker
        wait_for(
            lambda: ResourceRequest.objects.get(pk=request.pk).state == RequestState.ACTIVE,
            seconds=60,
            what="the request to become active",
            log=tmp_path / "worker2.log",
        )
    finally:
        kill(second)

    run = ProvisioningRun.objects.get(request=request)
    attempts = dict(run.steps.values_list("name", "attempts"))
    assert attempts == {"prepare_image": 1, "start_workload": 2, "readiness_check": 1, "publish_access": 1}
    assert "lease expired" in run.steps.get(name="start_workload").log
    active = Allocation.objects.filter(state=AllocationState.ACTIVE)
    assert list(active.values_list("request_id", flat=True)) == [request.pk]
    assert sorted(Device.objects.values_list("allocated_milli", flat=True)) == [0, 0, 1000, 1000]


def test_a_step_working_longer_than_its_lease_keeps_it(shop, team, settings, monkeypatch):
    """The heartbeat renews the lease while the handler works: past the first lease the step is still its worker's,
    the sweeper finds nothing to hand out, and the step runs once."""
    settings.PROVISIONING_LEASE_SECONDS = 1
    working, finish = threading.Event(), threading.Event()
    original = SimulatedHost.start_workload

    def slow_start(self, target, image):
        working.set()
        assert finish.wait(30), "the test never let the workload start"
        return original(self, target, image)

    monkeypatch.setattr(SimulatedHost, "start_workload", slow_start)
    add_node(shop.accelerator)
    # Submitting schedules and provisions inline (tasks run synchronously here), so it happens in its own thread.
    pool = ThreadPoolExecutor(1)
    submitting = pool.submit(
        in_own_connection(request_services.request_submit),
        order=make_order(shop, team.project),
        requester=team.developer,
    )
    try:
        wait_for(lambda: working.is_set() or submitting.done(), seconds=30, what="start_workload to start", log=None)
        assert working.is_set(), f"start_workload never started: {submitting.result()!r}"
        step = ProvisioningStep.objects.get(name="start_workload")
        first_lease = step.lease_expires_at
        wait_for(
            lambda: lease_renewed_past(step.pk, first_lease),
            seconds=30,
            what="the lease to be renewed past the first one while the clock passes it",
            log=None,
        )
        assert engine.steps_resume_due() == 0
        assert ProvisioningStep.objects.get(pk=step.pk).lease_owner == step.lease_owner
    finally:
        finish.set()
        pool.shutdown()
    assert ResourceRequest.objects.get().state == RequestState.ACTIVE
    assert ProvisioningStep.objects.get(pk=step.pk).attempts == 1


def lease_renewed_past(step_id: int, first_lease) -> bool:
    """The database's clock has passed the first lease and the step holds a later one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT now() > %s AND lease_expires_at > now() FROM provisioning_provisioningstep WHERE id = %s",
            [first_lease, step_id],
        )
        return cursor.fetchone()[0]


BACKOFF_SECONDS = 12  # slept through inline by the worker (under PROVISIONING_INLINE_WAIT_SECONDS), longer than 10 s
FLAKY_START = json.dumps(
    [{"op": "start_workload", "attempts": [1], "code": "flaky", "message": "Try again.", "retryable": True}]
)


@pytest.mark.parametrize("to_the_group", [False, True], ids=["main-process", "process-group"])
def test_sigterm_stops_a_busy_worker_within_10_s_and_hands_back_what_it_held(
    to_the_group, shop, team, monkeypatch, tmp_path
):
    monkeypatch.setattr(Conf, "SYNC", False)
    Schedule.objects.all().delete()  # only this test's tasks in the broker
    add_node(shop.accelerator)
    request = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    log = tmp_path / "worker.log"
    worker = start_worker(log, PROVISIONING_FAULTS=FLAKY_START, PROVISIONING_BACKOFF_SECONDS=str(BACKOFF_SECONDS))
    try:
        cycle.run_cycle()
        step = wait_for(
            lambda: ProvisioningStep.objects.filter(name="start_workload", state=StepState.WAITING, attempts=1).first(),
            seconds=60,
            what="start_workload to wait for its retry",
            log=log,
        )
        for number in range(3):  # the only worker is busy waiting: its cluster pulls these ahead and holds them
            async_task("scheduling.tasks.run_cycle", task_name=f"pulled-ahead-{number}")
        wait_for(lambda: len(held_tasks()) == 3, seconds=30, what="the cluster to pull the tasks ahead", log=log)

        # To the cluster's main process (docker stop), or to all its processes (systemd, `make run`'s kill 0).
        if to_the_group:
            os.killpg(worker.pid, signal.SIGTERM)
        else:
            worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"qcluster still running 10 s after SIGTERM. Worker log:\n{log.read_text()[-3000:]}")
    finally:
        kill(worker)

    # Each pulled task was handed back or (a worker told to stop first takes the next one) run: none held, none lost.
    # (A cycle that ran enqueued its duration for metering: follow-up work, not one of the pulled tasks.)
    handed_back = [task.name() for task in OrmQ.objects.all() if task.name().startswith("pulled-ahead-")]
    ran = list(Task.objects.filter(name__startswith="pulled-ahead-", success=True).values_list("name", flat=True))
    assert held_tasks() == [] and sorted(handed_back + ran) == [f"pulled-ahead-{number}" for number in range(3)]
    assert to_the_group or len(handed_back) == 3  # a stop from the main process hands them all back
    assert ProvisioningStep.objects.get(pk=step.pk).state == StepState.WAITING  # as recorded, due after the backoff
    second = start_worker(tmp_path / "worker2.log")
    try:
        wait_for(
            lambda: not OrmQ.objects.exists(),
            seconds=60,
            what="another cluster to run the handed-back tasks",
            log=tmp_path / "worker2.log",
        )
        wait_for(lambda: step_due(step.pk), seconds=2 * BACKOFF_SECONDS, what="the retry to fall due", log=None)
        assert engine.steps_resume_due() == 1
        wait_for(
            lambda: ResourceRequest.objects.get(pk=request.pk).state == RequestState.ACTIVE,
            seconds=60,
            what="the request to become active",
            log=tmp_path / "worker2.log",
        )
    finally:
        kill(second)
    assert ProvisioningStep.objects.get(pk=step.pk).attempts == 2


def held_tasks() -> list[str]:
    """The test's broker tasks that a cluster has pulled and locked (the step's own task is locked while it runs)."""
    return [
        task.name() for task in OrmQ.objects.filter(lock__gt=timezone.now()) if task.name().startswith("pulled-ahead-")
    ]


def step_due(step_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT retry_at <= now() FROM provisioning_provisioningstep WHERE id = %s", [step_id])
        return cursor.fetchone()[0]
