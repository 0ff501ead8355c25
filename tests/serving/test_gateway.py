"""The gateway data plane for real: `manage.py run_gateway` processes on the test database and a real Redis, in front
of the replicas a served order started. Keys, rate limits, budgets, failover, release and metering, across two
gateway processes where the issue asks for it."""

import json
import os
import signal
import time
from datetime import timedelta

import httpx
import pytest
from django.db import transaction
from django.utils import timezone

from metering.models import TokenUsage
from provisioning.choices import RunState
from provisioning.models import ProvisioningRun
from requests import services as request_services
from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling.models import Allocation, Device
from scheduling.services import node_cordon
from serving import keys
from serving.choices import DeploymentState
from serving.models import ServingDeployment, ServingReplica
from serving.routes import ROUTES_VERSION_KEY
from tests import factories
from tests.provisioning.conftest import add_node
from tests.provisioning.gateway_process import until

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

CHAT = {
    "model": "llama-3-8b-instruct",
    "messages": [{"role": "user", "content": "Say hello to the platform."}],
    "max_tokens": 16,
}


@pytest.fixture
def deployed(serving, gateway_redis):
    request = serving.order(rate_limit_per_minute=100)
    assert request.state == RequestState.ACTIVE
    issued = keys.api_key_create(project=serving.team.project, name="chat-frontend", actor=serving.team.developer)
    return request, ServingDeployment.objects.get(request=request), issued.secret


def call(gateway, deployment, secret, body=CHAT, path="chat/completions") -> httpx.Response:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {secret}"} if secret else {})}
    return httpx.post(
        f"{gateway.url}/serve/{deployment.slug}/v1/{path}", content=json.dumps(body), headers=headers, timeout=30
    )


def a_minute_with_room(seconds: float = 15) -> None:
    """The gateway counts calls per clock minute (a fixed window): a test that expects a 429 within one minute waits
    for the next minute when fewer than `seconds` are left in this one, or its calls would be split over two."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def ledger(request) -> tuple[int, int, int]:
    rows = TokenUsage.objects.filter(request=request).values_list("requests", "prompt_tokens", "completion_tokens")
    return tuple(map(sum, zip(*rows, strict=True))) if rows else (0, 0, 0)


def test_an_ordered_model_is_served_through_the_gateway_and_its_tokens_metered(deployed, gateways):
    request, deployment, secret = deployed
    run = ProvisioningRun.objects.get(request=request)
    assert run.state == RunState.SUCCEEDED and deployment.state == DeploymentState.SERVING
    assert run.delivered["endpoint"].endswith(f"/serve/{deployment.slug}/v1")
    gateway = gateways()
    answer = call(gateway, deployment, secret)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    until(lambda: ledger(request)[0] == 1, seconds=3, what="the flush")  # at least every second
    assert ledger(request) == (1, usage["prompt_tokens"], usage["completion_tokens"])
    row = TokenUsage.objects.get(request=request)
    assert row.project == request.project and row.key_prefix == secret.split("_")[1]


def test_streaming_passes_events_through_and_meters_the_final_usage(deployed, gateways):
    request, deployment, secret = deployed
    gateway = gateways()
    with httpx.stream(
        "POST",
        f"{gateway.url}/serve/{deployment.slug}/v1/chat/completions",
        content=json.dumps({**CHAT, "stream": True}),
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    ) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events if event.startswith("data: {")]
    final = next(chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage"))
    until(lambda: ledger(request)[0] == 1, seconds=3, what="the flush")
    assert ledger(request) == (1, final["prompt_tokens"], final["completion_tokens"])


def test_unknown_and_foreign_keys_are_refused_in_the_error_shape(deployed, gateways):
    _request, deployment, secret = deployed
    gateway = gateways()
    for wrong in ("cc_nothing_here", ""):
        refused = call(gateway, deployment, wrong)
        assert refused.status_code == 401 and set(refused.json()) == {"code", "message", "details"}
    other = factories.project()
    foreign = keys.api_key_create(project=other, name="theirs", actor=other.lead).secret
    until(lambda: call(gateway, deployment, foreign).status_code == 403, seconds=2, what="the new key")
    assert call(gateway, deployment, foreign).json()["code"] == "key_not_for_this_deployment"
    missing = httpx.post(
        f"{gateway.url}/serve/no-such-thing/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"}
    )
    assert missing.status_code == 404 and missing.json()["code"] == "unknown_deployment"


def test_a_key_revoked_through_the_api_is_refused_by_two_gateways_within_a_second(deployed, gateways, api_as, serving):
    _request, deployment, secret = deployed
    first, second = gateways(), gateways()
    assert [call(g, deployment, secret).status_code for g in (first, second)] == [200, 200]
    key = keys.api_key_authenticate(secret)
    revoked = api_as(serving.team.developer).post(f"/api/v1/api-keys/{key.pk}/revoke/")
    assert revoked.status_code == 200
    for gateway in (first, second):
        took, _ = until(
            lambda g=gateway: call(g, deployment, secret).status_code == 401, seconds=1.0, what="the revocation"
        )
        assert took < 1.0


def test_a_rotated_key_keeps_its_grace_period_and_a_zero_grace_ends_it_at_once(deployed, gateways, serving):
    _request, deployment, old_secret = deployed
    gateway = gateways()
    key = keys.api_key_authenticate(old_secret)
    new_secret = keys.api_key_rotate(key=key, actor=serving.team.developer, grace_hours=2).secret
    until(lambda: call(gateway, deployment, new_secret).status_code == 200, seconds=1, what="the new key")
    assert call(gateway, deployment, old_secret).status_code == 200  # callers switch over without an outage
    newer = keys.api_key_rotate(key=keys.api_key_authenticate(new_secret), actor=serving.team.developer, grace_hours=0)
    until(lambda: call(gateway, deployment, new_secret).status_code == 401, seconds=1, what="the rotation")
    assert call(gateway, deployment, newer.secret).status_code == 200


def counters(store, key, deployment) -> dict[int, int]:
    """Each clock minute's counter in Redis (by minute) as it stands. Every counter the gateways wrote is this key's on
    this deployment: both gateways count on the same one."""
    prefix = f"gateway:rate:{key.pk}:{deployment.pk}:"
    found = {name.decode(): int(store.get(name)) for name in store.scan_iter("gateway:rate:*")}
    assert all(name.startswith(prefix) for name in found), found
    return {int(name.removeprefix(prefix)): count for name, count in found.items()}


def test_the_rate_limit_holds_across_two_gateways_sharing_redis(serving, gateways, gateway_redis):
    request = serving.order(rate_limit_per_minute=6)
    deployment = ServingDeployment.objects.get(request=request)
    issued = keys.api_key_create(project=serving.team.project, name="k", actor=serving.team.developer)
    first, second = gateways(), gateways()
    # The limit holds per clock minute (a fixed window) and the calls, one after another, may run over into the next
    # minute: each call's count is the counter that grew with it, read right after it (the calls are sequential, so
    # it is the count the limiter saw).
    answers, seen = [], {}
    for gateway in [first, second] * 6:
        answer = call(gateway, deployment, issued.secret)
        now = counters(gateway_redis, issued.key, deployment)
        counts = [count for minute, count in now.items() if count > seen.get(minute, 0)]
        seen.update(now)
        answers.append((answer.status_code, answer.json().get("code") if answer.status_code != 200 else None, counts))
    # Redis that answers too late (a loaded machine) makes a call 503, never admitted, counted or not; every other
    # call is counted once and admitted exactly while its minute's count is within the limit.
    assert all(code == "rate_limiter_unavailable" for status, code, _ in answers if status == 503), answers
    counted = [(status, counts) for status, _, counts in answers if status != 503]
    assert all(len(counts) == 1 for _, counts in counted), answers
    assert [status for status, _ in counted] == [200 if counts[0] <= 6 else 429 for _, counts in counted], answers
    # A new minute's first calls are admitted up to the limit, then refused (this also reaches it when the 12 calls
    # fell 6 and 6 into two minutes).
    while (limited := call(first, deployment, issued.secret)).status_code == 200:
        now = counters(gateway_redis, issued.key, deployment)
        assert now[max(now)] <= 6
    assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60


def test_without_redis_the_rate_limit_is_counted_per_gateway_process(serving, gateways):
    request = serving.order(rate_limit_per_minute=2)
    deployment = ServingDeployment.objects.get(request=request)
    secret = keys.api_key_create(project=serving.team.project, name="k", actor=serving.team.developer).secret
    gateway = gateways(REDIS_URL="")
    a_minute_with_room()
    assert [call(gateway, deployment, secret).status_code for _ in range(3)] == [200, 200, 429]


def test_an_exhausted_token_budget_answers_429(serving, gateways):
    request = serving.order(monthly_token_budget=20)
    deployment = ServingDeployment.objects.get(request=request)
    secret = keys.api_key_create(project=serving.team.project, name="k", actor=serving.team.developer).secret
    gateway = gateways()
    assert call(gateway, deployment, secret).status_code == 200  # 16 output tokens + the prompt: over 20
    refused = call(gateway, deployment, secret)
    assert refused.status_code == 429 and refused.json()["code"] == "token_budget_exhausted"
    assert refused.json()["details"]["budget"] == 20
    # A gateway started later reads the ledger's total: the budget holds across processes and restarts.
    until(lambda: ledger(request)[0] == 1, seconds=3, what="the flush")
    assert call(gateways(), deployment, secret).json()["code"] == "token_budget_exhausted"


def test_sigterm_flushes_what_the_gateway_served(deployed, gateways):
    request, deployment, secret = deployed
    gateway = gateways(GATEWAY_FLUSH_SECONDS="3600")  # nothing flushes on its own during the test
    answers = [call(gateway, deployment, secret).json()["usage"] for _ in range(5)]
    assert ledger(request) == (0, 0, 0)
    assert gateway.stop(signal.SIGTERM) == 0, gateway.tail()
    assert ledger(request) == (
        5,
        sum(a["prompt_tokens"] for a in answers),
        sum(a["completion_tokens"] for a in answers),
    )


def test_a_stop_during_a_flush_held_up_by_the_database_prints_where_it_waits_and_meters_each_call_once(
    deployed, gateways
):
    request, deployment, secret = deployed
    gateway = gateways(GATEWAY_FLUSH_SECONDS="0.1", GATEWAY_SHUTDOWN_SECONDS="0.5")
    with transaction.atomic():
        # The ledger's row names the request: the flush's commit waits for this lock (the foreign key's check).
        ResourceRequest.objects.select_for_update().get(pk=request.pk)
        usage = call(gateway, deployment, secret).json()["usage"]
        until(gateway.waits_on_a_lock, seconds=10, what="the flush to wait for the lock")
        gateway.process.send_signal(signal.SIGTERM)
        until(lambda: "(most recent call first)" in gateway.tail(), seconds=10, what="the stacks of the stop")
        assert gateway.process.poll() is None, gateway.tail()
    assert gateway.process.wait(timeout=20) == 0, gateway.tail()
    # The stop let the flush under way end: its tallies were not put back for the last flush to write again.
    assert ledger(request) == (1, usage["prompt_tokens"], usage["completion_tokens"])


def test_a_killed_replica_is_marked_down_and_traffic_fails_over(deployed, gateways, api_as):
    request, deployment, secret = deployed
    gateway = gateways()
    victim = deployment.replicas.get(name="replica-0")
    os.kill(victim.pid, signal.SIGKILL)
    assert [call(gateway, deployment, secret).status_code for _ in range(4)] == [200] * 4
    until(lambda: not ServingReplica.objects.get(pk=victim.pk).healthy, seconds=2, what="the replica marked down")
    victim.refresh_from_db()
    assert "could not reach" in victim.last_error
    endpoint = api_as(request.requester).get(f"/api/v1/requests/{request.pk}/").json()["endpoint"]
    assert {replica["name"]: replica["healthy"] for replica in endpoint["replicas"]} == {
        "replica-0": False,
        "replica-1": True,
    }


def test_replicas_on_three_nodes_keep_serving_when_one_node_is_cordoned(serving, shop, gateway_redis, gateways):
    """Each replica runs on its own node (anti-affinity); cordoning one node takes only its replica out of
    rotation at once, and the endpoint answers through the two others. The release then frees all three."""
    serving.template.replicas = 3
    serving.template.save(update_fields=["replicas"])
    for name in ("n2", "n3"):
        add_node(shop.accelerator, name=name)
    request = serving.order(rate_limit_per_minute=1000)
    assert request.state == RequestState.ACTIVE
    deployment = ServingDeployment.objects.get(request=request)
    replicas = list(deployment.replicas.select_related("allocation__node").order_by("name"))
    assert sorted(replica.allocation.node.name for replica in replicas) == ["n1", "n2", "n3"]
    assert {replica.allocation.replica for replica in replicas} == {0, 1, 2}
    delivered = ProvisioningRun.objects.get(request=request).delivered
    assert sorted(replica["node"] for replica in delivered["replicas"]) == ["n1", "n2", "n3"]
    secret = keys.api_key_create(project=serving.team.project, name="frontend", actor=serving.team.developer).secret
    gateway = gateways()
    assert [call(gateway, deployment, secret).status_code for _ in range(3)] == [200] * 3

    victim = replicas[1]
    node_cordon(
        node=victim.allocation.node, reason="fan failure", actor=factories.operator()
    )  # transactional test: commits at once
    victim.refresh_from_db()
    assert not victim.healthy and victim.last_error == f"node {victim.allocation.node.name} cordoned: fan failure"
    os.kill(victim.pid, signal.SIGKILL)  # were it still in rotation, the gateway would find it dead and say so
    time.sleep(1.0)  # the gateways' reload after the version bump
    assert [call(gateway, deployment, secret).status_code for _ in range(6)] == [200] * 6
    victim.refresh_from_db()
    assert "cordoned" in victim.last_error  # never tried: no "could not reach" from the gateway
    assert ServingReplica.objects.filter(deployment=deployment, healthy=True).count() == 2

    request_services.request_release(request=request, actor=request.requester, reason="done")
    until(lambda: fresh_state(request) == RequestState.RELEASED, seconds=10, what="the release")
    assert set(Allocation.objects.filter(request=request).values_list("state", flat=True)) == {"released"}
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def fresh_state(request) -> str:
    request.refresh_from_db()
    return request.state


def test_with_every_replica_down_the_gateway_answers_502_at_once(deployed, gateways):
    _request, deployment, secret = deployed
    gateway = gateways()
    for replica in deployment.replicas.all():
        os.kill(replica.pid, signal.SIGKILL)
    first = call(gateway, deployment, secret)
    assert first.status_code == 502 and first.json()["code"] == "upstream_unavailable"
    assert call(gateway, deployment, secret).json()["code"] == "no_healthy_replica"


def test_release_answers_404_within_a_second_and_stops_the_replicas(deployed, gateways, run_on_commit):
    request, deployment, secret = deployed
    gateway = gateways()
    assert call(gateway, deployment, secret).status_code == 200
    pids = list(deployment.replicas.values_list("pid", flat=True))
    started = timezone.now()
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    took, _ = until(lambda: call(gateway, deployment, secret).status_code == 404, seconds=1.0, what="the 404")
    assert (timezone.now() - started) < timedelta(seconds=5) and took < 1.0
    assert call(gateway, deployment, secret).json()["code"] == "unknown_deployment"
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert set(ServingReplica.objects.values_list("pid", flat=True)) == {None}
    assert all(exits(pid) for pid in pids)


def test_a_control_plane_change_bumps_the_version_the_gateways_poll(deployed, gateway_redis, serving):
    _request, _deployment, secret = deployed
    before = int(gateway_redis.get(ROUTES_VERSION_KEY) or 0)
    keys.api_key_revoke(key=keys.api_key_authenticate(secret), actor=serving.team.developer)
    assert int(gateway_redis.get(ROUTES_VERSION_KEY)) > before


def test_the_web_server_relays_serve_urls_to_the_gateway(deployed, gateways, client, settings):
    _request, deployment, secret = deployed
    settings.GATEWAY_URL = gateways().url
    answer = client.post(
        f"/serve/{deployment.slug}/v1/chat/completions",
        json.dumps(CHAT),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
    refused = client.post(f"/serve/{deployment.slug}/v1/chat/completions", "{}", content_type="application/json")
    assert refused.status_code == 401 and refused.json()["code"] == "invalid_api_key"


def test_tokens_show_on_the_usage_report_and_metrics_by_project_and_model(deployed, gateways, api_as):
    request, deployment, secret = deployed
    usage = call(gateways(), deployment, secret).json()["usage"]
    until(lambda: ledger(request)[0] == 1, seconds=3, what="the flush")
    rows = api_as(request.requester).get("/api/v1/usage/tokens/").json()
    assert rows == [
        {
            "month": f"{request.created_at:%Y-%m}",
            "project": request.project.slug,
            "model": "llama-3-8b-instruct",
            "requests": 1,
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        }
    ]
    assert api_as(factories.member(factories.project())).get("/api/v1/usage/tokens/").json() == []


def exits(pid: int) -> bool:
    """The inference server ends after the SIGTERM the release sent (it is this test process's child here)."""
    try:
        return os.waitpid(pid, 0)[0] == pid
    except ChildProcessError:  # already reaped
        return True
