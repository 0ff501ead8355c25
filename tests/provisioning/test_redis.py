"""Redis for real, as when scaled out: with REDIS_URL set, django-q2's Redis broker carries a scheduling cycle and a
provisioning run to a real qcluster (the gateway's use of Redis, rate limit and control-plane signal across two
gateway processes, is in test_gateway.py). Uses its own Redis database (REDIS_TEST_URL, default DB 7) and flushes
only that one; no Redis fails."""

import os

import pytest
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule, Task
from django_q.tasks import async_task

from provisioning.choices import StepState
from provisioning.models import ProvisioningStep
from requests import services as request_services
from requests.choices import RequestState
from requests.models import ResourceRequest
from tests.provisioning.conftest import add_node
from tests.provisioning.test_crash_safety import kill, start_worker, wait_for
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

REDIS_URL = os.environ.get("REDIS_TEST_URL", "redis://127.0.0.1:6379/7")
QUEUE = f"django_q:{Conf.CLUSTER_NAME}:q"  # the Redis broker's list


@pytest.fixture
def on_redis_broker(monkeypatch, redis_db):
    """This process enqueues into the Redis broker, as every process does when REDIS_URL is set."""
    monkeypatch.setattr(Conf, "SYNC", False)
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", REDIS_URL)


def test_the_redis_broker_carries_a_scheduling_cycle_and_a_provisioning_run(
    shop, team, on_redis_broker, redis_db, tmp_path
):
    Schedule.objects.all().delete()  # only this test's tasks
    add_node(shop.accelerator)
    request = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    async_task("scheduling.tasks.run_cycle")
    assert redis_db.llen(QUEUE) >= 1 and not OrmQ.objects.exists()  # queued in Redis, not in the ORM
    log = tmp_path / "worker.log"
    worker = start_worker(log, REDIS_URL=REDIS_URL)
    carried = {"scheduling.tasks.run_cycle", "provisioning.tasks.start_runs"}
    try:
        wait_for(
            lambda: ResourceRequest.objects.get(pk=request.pk).state == RequestState.ACTIVE,
            seconds=90,
            what="the request to be placed and provisioned",
            log=log,
        )
        # The request turns active inside the start task; the cluster's monitor saves that task's result after it
        # returns, so the results are waited on too rather than read at once.
        wait_for(lambda: carried <= _succeeded_tasks(), seconds=30, what="both tasks' results to be saved", log=log)
    finally:
        kill(worker)
    assert not OrmQ.objects.exists() and redis_db.llen(QUEUE) == 0
    ran = _succeeded_tasks()
    # Step tasks keep no django-q2 result (provisioning.step_tasks.step_task): their steps record what they did.
    assert "provisioning.tasks.run_step" not in ran
    steps = ProvisioningStep.objects.filter(run__request=request)
    assert steps.exists() and not steps.exclude(state=StepState.SUCCEEDED).exists()


def _succeeded_tasks() -> set[str]:
    return set(Task.objects.filter(success=True).values_list("func", flat=True))
