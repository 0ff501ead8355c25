"""Redis for real, as when scaled out: with REDIS_URL set, django-q2's Redis broker carries a scheduling cycle and a
provisioning run to a real qcluster, and the Redis cache carries the gateway's rate limit across two gunicorn
workers. Uses its own Redis database (REDIS_TEST_URL, default DB 7) and flushes only that one; no Redis fails."""

import json
import os
import subprocess
import sys
import threading

import httpx
import pytest
import redis
from django.db import connection
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule, Task
from django_q.tasks import async_task

from provisioning.choices import StepState
from provisioning.models import ProvisioningStep, ServingDeployment
from provisioning.serving import keys
from requests import services as request_services
from requests.choices import RequestState
from requests.models import ResourceRequest
from tests.provisioning.conftest import add_node
from tests.provisioning.redfish_emulator import free_loopback_port
from tests.provisioning.test_crash_safety import REPO, kill, start_worker, wait_for
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

REDIS_URL = os.environ.get("REDIS_TEST_URL", "redis://127.0.0.1:6379/7")
RATE_LIMIT = 6
QUEUE = f"django_q:{Conf.CLUSTER_NAME}:q"  # the Redis broker's list


@pytest.fixture
def redis_db():
    store = redis.from_url(REDIS_URL)
    store.flushdb()
    yield store
    store.flushdb()
    store.close()


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
    try:
        wait_for(
            lambda: ResourceRequest.objects.get(pk=request.pk).state == RequestState.ACTIVE,
            seconds=90,
            what="the request to be placed and provisioned",
            log=log,
        )
    finally:
        kill(worker)
    assert not OrmQ.objects.exists() and redis_db.llen(QUEUE) == 0
    ran = set(Task.objects.filter(success=True).values_list("func", flat=True))
    assert {"scheduling.tasks.run_cycle", "provisioning.tasks.start_runs"} <= ran
    # Step tasks keep no django-q2 result (provisioning.services.step_task): their steps record what they did.
    assert "provisioning.tasks.run_step" not in ran
    steps = ProvisioningStep.objects.filter(run__request=request)
    assert steps.exists() and not steps.exclude(state=StepState.SUCCEEDED).exists()


def start_gunicorn(log) -> tuple[subprocess.Popen, str]:
    database = connection.settings_dict
    port = free_loopback_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "REDIS_URL": REDIS_URL,
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "--workers", "2", "--bind", f"127.0.0.1:{port}"],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def answering():
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answering, seconds=60, what="gunicorn to answer", log=log)
    return server, url


def test_the_gateway_rate_limit_holds_across_two_gunicorn_workers(serving, redis_db, tmp_path):
    request = serving.order(rate_limit_per_minute=RATE_LIMIT)
    assert request.state == RequestState.ACTIVE
    deployment = ServingDeployment.objects.get(request=request)
    secret = keys.api_key_create(project=serving.team.project, name="k", actor=serving.team.developer).secret
    log = tmp_path / "gunicorn.log"
    server, url = start_gunicorn(log)
    statuses = []

    def ask_six_times():  # a new connection each time: either worker may take it
        for _ in range(RATE_LIMIT):
            answer = httpx.post(
                f"{url}/serve/{deployment.slug}/v1/completions",
                timeout=30,
                headers={"Authorization": f"Bearer {secret}"},
                content=json.dumps({"model": deployment.model_name, "prompt": "hi", "max_tokens": 4}),
            )
            statuses.append(answer.status_code)

    try:
        clients = [threading.Thread(target=ask_six_times) for _ in range(2)]  # two at once: both workers serve
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=60)
    finally:
        kill(server)
    assert sorted(statuses) == [200] * RATE_LIMIT + [429] * RATE_LIMIT, log.read_text()[-3000:]
    assert list(redis_db.scan_iter("*gateway:rate:*"))  # the counter lives in Redis
