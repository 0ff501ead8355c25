"""Crash safety with real worker processes: a `qcluster` killed mid-step leaves a lease that expires; another
worker resumes the run from that step, runs no completed step again, and leaves no orphan allocation."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django_q.conf import Conf

from provisioning import engine
from provisioning.choices import StepState
from provisioning.models import ProvisioningRun, ProvisioningStep
from requests import services as request_services
from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling import cycle
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device
from tests.provisioning.conftest import add_node
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

REPO = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 3  # the start_workload step's timeout, hence its lease


def start_worker(log: Path) -> subprocess.Popen:
    """A real `manage.py qcluster` on the test database, in its own process group (so it can be killed whole)."""
    database = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings_test", "Q_SYNC": "0", "Q_WORKERS": "1",
           "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
           "PROVISIONING_SIMULATED_SPEED": "0.1",
           "PROVISIONING_STEP_TIMEOUTS": f'{{"start_workload": {LEASE_SECONDS}}}'}
    return subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, env=env, start_new_session=True,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_for(condition, *, seconds: float, what: str, log: Path):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    pytest.fail(f"Timed out waiting for {what}. Worker log:\n{log.read_text()[-3000:]}")


def kill(worker: subprocess.Popen) -> None:
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)


def test_a_worker_killed_mid_step_is_replaced_without_repeating_steps(shop, team, monkeypatch, settings, tmp_path):
    monkeypatch.setattr(Conf, "SYNC", False)  # this process enqueues into the broker; the workers run the tasks
    settings.PROVISIONING_STEP_TIMEOUTS = {"start_workload": LEASE_SECONDS}
    add_node(shop.accelerator)
    request = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    log = tmp_path / "worker.log"
    first = start_worker(log)
    try:
        cycle.run_cycle()  # allocates; provisioning starts in the worker
        step = wait_for(lambda: ProvisioningStep.objects.filter(name="start_workload", state=StepState.RUNNING)
                        .first(), seconds=60, what="start_workload to be running", log=log)
    finally:
        kill(first)
    assert ProvisioningStep.objects.get(pk=step.pk).state == StepState.RUNNING  # the dead worker's lease remains

    time.sleep(LEASE_SECONDS + 0.5)
    second = start_worker(tmp_path / "worker2.log")
    try:
        assert engine.steps_resume_due() == 1  # the sweeper hands the expired step to the new worker
        wait_for(lambda: ResourceRequest.objects.get(pk=request.pk).state == RequestState.ACTIVE, seconds=60,
                 what="the request to become active", log=tmp_path / "worker2.log")
    finally:
        kill(second)

    run = ProvisioningRun.objects.get(request=request)
    attempts = dict(run.steps.values_list("name", "attempts"))
    assert attempts == {"prepare_image": 1, "start_workload": 2, "readiness_check": 1, "publish_access": 1}
    assert "lease expired" in run.steps.get(name="start_workload").log
    active = Allocation.objects.filter(state=AllocationState.ACTIVE)
    assert list(active.values_list("request_id", flat=True)) == [request.pk]
    assert sorted(Device.objects.values_list("allocated_milli", flat=True)) == [0, 0, 1000, 1000]
