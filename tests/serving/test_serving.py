"""Model serving end to end: order -> approve -> active -> the gateway with a project key (plain and streaming)
-> tokens metered; wrong, revoked and foreign keys; the rate limit; the token budget; a killed replica; release."""

import json

import pytest
from django.urls import reverse

from requests.choices import RequestState
from scheduling.models import Node
from scheduling.services import node_cordon, node_uncordon
from serving import deployments, keys
from serving.choices import DeploymentState
from serving.models import ServingDeployment
from tests import factories
from tests.provisioning.conftest import add_node

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


def test_the_endpoint_health_panel_refreshes_for_the_project_only(deployed, client):
    request, _deployment, _secret = deployed
    url = reverse("portal:request-endpoint-health", args=[request.pk])
    client.force_login(request.requester)
    panel = client.get(url).content.decode()
    assert 'data-replica="replica-0" data-healthy="yes"' in panel and "hx-trigger" in panel
    client.force_login(factories.member(factories.project()))
    assert client.get(url).status_code == 404


def health(deployment) -> dict[str, tuple[bool, str]]:
    return {replica.name: (replica.healthy, replica.last_error) for replica in deployment.replicas.order_by("name")}


def test_a_cordoned_node_takes_its_replica_out_until_uncordoned(serving, shop, run_on_commit):
    add_node(shop.accelerator, name="n2")
    request = serving.order()
    deployment = ServingDeployment.objects.get(request=request)
    on_node = {replica.allocation.node.name: replica.name for replica in deployment.replicas.all()}
    assert sorted(on_node) == ["n1", "n2"]  # a replica on each node
    node = Node.objects.get(name="n2")
    run_on_commit(node_cordon, node=node, reason="firmware update", actor=factories.operator())
    cordoned = (False, "node n2 cordoned: firmware update")
    assert health(deployment) == {on_node["n1"]: (True, ""), on_node["n2"]: cordoned}
    assert "leave the endpoint's rotation" in request.events.get(code="node_cordoned").message
    assert deployments.serving_replicas_check() == 1  # the minute check keeps it out while the cordon lasts
    run_on_commit(node_uncordon, node=Node.objects.get(name="n2"), reason="done", actor=factories.operator())
    assert health(deployment) == {name: (True, "") for name in on_node.values()}


def test_replicas_sharing_a_cordoned_node_keep_serving_there(serving, run_on_commit):
    """Both replicas on the one node there is: cordoning it takes nothing out of rotation (what runs on a cordoned
    node keeps running), and the record says they share it."""
    request = serving.order()
    deployment = ServingDeployment.objects.get(request=request)
    run_on_commit(
        node_cordon, node=Node.objects.get(name="n1"), reason="drain for maintenance", actor=factories.operator()
    )
    assert health(deployment) == {"replica-0": (True, ""), "replica-1": (True, "")}
    assert request.events.get(code="allocated").data["spread"]["numbers"]["shared"] == {"n1": [0, 1]}
