"""Model serving end to end: order -> approve -> active -> the gateway with a project key (plain and streaming)
-> tokens metered; wrong, revoked and foreign keys; the rate limit; the token budget; a killed replica; release."""

import json
import os
import signal
from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from metering.models import TokenUsage
from provisioning.choices import DeploymentState, RunState
from provisioning.models import ProvisioningRun, ServingDeployment, ServingReplica
from provisioning.serving import deployments, keys
from requests import services as request_services
from requests.choices import RequestState
from tests import factories

pytestmark = pytest.mark.django_db

CHAT = {
    "model": "llama-3-8b-instruct",
    "messages": [{"role": "user", "content": "Say hello to the platform."}],
    "max_tokens": 16,
}


@pytest.fixture
def deployed(serving):
    request = serving.order(rate_limit_per_minute=100)
    assert request.state == RequestState.ACTIVE
    issued = keys.api_key_create(project=serving.team.project, name="chat-frontend", actor=serving.team.developer)
    return request, ServingDeployment.objects.get(request=request), issued.secret


def call(client, deployment, secret, body=CHAT, path="chat/completions"):
    return client.post(
        f"/serve/{deployment.slug}/v1/{path}",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


def test_an_ordered_model_is_served_through_the_gateway_and_its_tokens_metered(deployed, client):
    request, deployment, secret = deployed
    run = ProvisioningRun.objects.get(request=request)
    assert run.state == RunState.SUCCEEDED
    assert list(run.steps.values_list("name", flat=True)) == [
        "start_replicas",
        "wait_replicas_ready",
        "register_routes",
        "publish_endpoint",
    ]
    assert deployment.state == DeploymentState.SERVING
    assert set(deployment.replicas.values_list("healthy", flat=True)) == {True}
    assert run.delivered["endpoint"].endswith(f"/serve/{deployment.slug}/v1")

    answer = call(client, deployment, secret)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["choices"][0]["message"]["content"]
    usage = body["usage"]
    row = TokenUsage.objects.get(request=request)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (
        1,
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert row.project == request.project and row.key_prefix == secret.split("_")[1]


def test_streaming_passes_events_through_and_meters_the_final_usage(deployed, client):
    request, deployment, secret = deployed
    answer = call(client, deployment, secret, {**CHAT, "stream": True})
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/event-stream")
    events = b"".join(answer.streaming_content).decode().split("\n\n")
    assert events[-2] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events if event.startswith("data: {")]
    final_usage = next(chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage"))
    row = TokenUsage.objects.get(request=request)
    assert (row.prompt_tokens, row.completion_tokens) == (
        final_usage["prompt_tokens"],
        final_usage["completion_tokens"],
    )


def test_unknown_revoked_and_foreign_keys_are_refused(deployed, client, serving):
    _request, deployment, secret = deployed
    assert call(client, deployment, "cc_nothing_here").status_code == 401
    assert call(client, deployment, "").status_code == 401
    other = factories.project()
    foreign = keys.api_key_create(project=other, name="theirs", actor=other.lead).secret
    refused = call(client, deployment, foreign)
    assert refused.status_code == 403 and refused.json()["code"] == "key_not_for_this_deployment"
    key = keys.api_key_authenticate(secret)
    keys.api_key_revoke(key=key, actor=serving.team.developer)
    assert call(client, deployment, secret).json()["code"] == "invalid_api_key"
    assert not TokenUsage.objects.exists()


def test_the_gateway_honours_a_rotated_keys_grace_period(deployed, client, serving):
    _request, deployment, old_secret = deployed
    key = keys.api_key_authenticate(old_secret)
    new_secret = keys.api_key_rotate(key=key, actor=serving.team.developer, grace_hours=2).secret
    assert call(client, deployment, old_secret).status_code == 200  # callers switch over without an outage
    with time_machine.travel(timezone.now() + timedelta(hours=2, seconds=1)):
        assert call(client, deployment, old_secret).json()["code"] == "invalid_api_key"
        assert call(client, deployment, new_secret).status_code == 200


def test_the_rate_limit_answers_429_with_retry_after(serving, client):
    request = serving.order(rate_limit_per_minute=2)
    deployment = ServingDeployment.objects.get(request=request)
    secret = keys.api_key_create(project=serving.team.project, name="k", actor=serving.team.developer).secret
    assert [call(client, deployment, secret).status_code for _ in range(2)] == [200, 200]
    limited = call(client, deployment, secret)
    assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
    assert 1 <= int(limited["Retry-After"]) <= 60


def test_an_exhausted_token_budget_stops_the_deployment_until_next_month(serving, client):
    request = serving.order(monthly_token_budget=20)
    deployment = ServingDeployment.objects.get(request=request)
    secret = keys.api_key_create(project=serving.team.project, name="k", actor=serving.team.developer).secret
    assert call(client, deployment, secret).status_code == 200  # 16 output tokens + the prompt: over 20
    refused = call(client, deployment, secret)
    assert refused.status_code == 429 and refused.json()["code"] == "token_budget_exhausted"
    assert refused.json()["details"]["budget"] == 20


def test_a_killed_replica_is_reported_and_traffic_goes_to_the_healthy_one(deployed, client, api_as):
    request, deployment, secret = deployed
    victim = deployment.replicas.get(name="replica-0")
    os.kill(victim.pid, signal.SIGKILL)
    answers = [call(client, deployment, secret).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 200]
    victim.refresh_from_db()
    assert not victim.healthy and "could not reach" in victim.last_error
    endpoint = api_as(request.requester).get(f"/api/v1/requests/{request.pk}/").json()["endpoint"]
    assert {replica["name"]: replica["healthy"] for replica in endpoint["replicas"]} == {
        "replica-0": False,
        "replica-1": True,
    }


def test_with_every_replica_down_the_gateway_answers_502_at_once(deployed, client):
    _request, deployment, secret = deployed
    for replica in deployment.replicas.all():
        os.kill(replica.pid, signal.SIGKILL)
    first = call(client, deployment, secret)
    assert first.status_code == 502 and first.json()["code"] == "upstream_unavailable"
    assert call(client, deployment, secret).json()["code"] == "no_healthy_replica"


def test_release_removes_the_route_and_stops_the_replicas(deployed, client, run_on_commit):
    request, deployment, secret = deployed
    pids = list(deployment.replicas.values_list("pid", flat=True))
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    gone = call(client, deployment, secret)
    assert gone.status_code == 404 and gone.json()["code"] == "unknown_deployment"
    assert set(ServingReplica.objects.values_list("pid", flat=True)) == {None}
    assert all(exits(pid) for pid in pids)


def test_routing_moves_are_idempotent_and_a_stopped_deployment_can_serve_again(deployed):
    request, deployment, _secret = deployed
    assert deployments.deployment_serve(deployment=deployment).state == DeploymentState.SERVING  # a step run twice
    assert deployments.deployment_stop(request=request) == 1
    stopped = ServingDeployment.objects.get(pk=deployment.pk)
    assert stopped.state == DeploymentState.STOPPED and stopped.stopped_at is not None
    assert deployments.deployment_stop(request=request) == 1
    assert ServingDeployment.objects.get(pk=deployment.pk).stopped_at == stopped.stopped_at
    served = deployments.deployment_serve(deployment=deployment)  # a retried provisioning routes it again
    assert (served.state, served.stopped_at) == (DeploymentState.SERVING, None)


def exits(pid: int) -> bool:
    """The inference server ends after the SIGTERM the release sent (it is this test process's child here)."""
    try:
        return os.waitpid(pid, 0)[0] == pid
    except ChildProcessError:  # already reaped
        return True


@pytest.mark.parametrize(("value", "rule"), [("lots", "type"), (0, "min"), (2**31, "max"), (True, "type")])
def test_invalid_serving_parameters_are_refused(serving, value, rule):
    """The serving limits are parameters of the service's schema like any other (its rate limit column is a
    32-bit integer, so the schema's maximum keeps provisioning from failing on it later)."""
    from catalog.parameters import ParameterInvalid

    with pytest.raises(ParameterInvalid) as refusal:
        serving.order(rate_limit_per_minute=value)
    assert (refusal.value.code, refusal.value.details["rule"]) == ("parameter_invalid", rule)


def test_request_page_shows_the_endpoint_curl_and_key_management(deployed, client):
    request, deployment, _secret = deployed
    client.force_login(request.requester)
    page = client.get(reverse("portal:request-detail", args=[request.pk])).content.decode()
    assert deployment.slug in page and "curl " in page and "chat-frontend" in page
    created = client.post(reverse("serving-key-create", args=[request.pk]), {"name": "batch-jobs"})
    assert created.status_code == 302  # a reload of the page it lands on creates nothing
    body = client.get(created["Location"]).content.decode()
    shown = body.split('id="new-key-secret"')[1].split(">")[1].split("</code")[0]
    assert keys.api_key_authenticate(shown).name == "batch-jobs"
    assert f"Bearer {shown}" in body.split('id="new-key-curl"')[1]  # the curl is ready to paste
    again = client.get(reverse("portal:request-detail", args=[request.pk])).content.decode()
    assert shown not in again  # shown once


def test_the_endpoint_url_follows_the_address_the_page_was_reached_by(deployed, client, settings):
    request, deployment, _secret = deployed
    settings.ALLOWED_HOSTS = ["gpu.example.test"]
    client.force_login(request.requester)
    page = client.get(reverse("portal:request-detail", args=[request.pk]), HTTP_HOST="gpu.example.test:8200")
    connect = page.content.decode().split('id="connect"')[1].split("</section>")[0]
    assert f"http://gpu.example.test:8200/serve/{deployment.slug}/v1/chat/completions" in connect
    assert settings.PUBLIC_BASE_URL not in connect


def test_tokens_show_on_the_usage_report_page_and_metrics_by_project_and_model(deployed, client, api_as):
    from prometheus_client.parser import text_string_to_metric_families

    request, deployment, secret = deployed
    usage = call(client, deployment, secret).json()["usage"]
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
    client.force_login(request.requester)
    assert "llama-3-8b-instruct" in client.get("/usage/").content.decode().split('id="tokens-table"')[1]
    exposition = client.get("/metrics").content.decode()
    families = {family.name: family for family in text_string_to_metric_families(exposition)}
    served = {
        (sample.labels["project"], sample.labels["model"]): sample.value
        for sample in families["compute_serving_completion_tokens"].samples
    }
    assert served[(request.project.slug, "llama-3-8b-instruct")] == usage["completion_tokens"]


def test_the_endpoint_health_panel_refreshes_for_the_project_only(deployed, client):
    request, _deployment, _secret = deployed
    url = reverse("portal:request-endpoint-health", args=[request.pk])
    client.force_login(request.requester)
    panel = client.get(url).content.decode()
    assert 'data-replica="replica-0" data-healthy="yes"' in panel and "hx-trigger" in panel
    client.force_login(factories.member(factories.project()))
    assert client.get(url).status_code == 404
