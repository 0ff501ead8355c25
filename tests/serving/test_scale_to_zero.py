"""Scale to zero, for real: an endpoint ordered through the whole pipeline, a `manage.py run_gateway` process in front
of its stand-in inference servers, the idle sweep with the clock moved (`time_machine`). No call for the policy's
time: warned by mail and on the page, then scaled to zero (no replica, no allocation, its servers gone, its route
and keys kept); its next calls wake it once — one replica through the queue, the scheduler and provisioning — and
are answered; a call that cannot wait that long gets 503 with a Retry-After."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import time_machine

from metering.choices import IdleAction
from metering.idle import services as idle_services
from metering.models import IdlePolicy, TokenUsage
from requests.choices import EventCode, RequestState
from scheduling.choices import AllocationState
from scheduling.models import Allocation
from serving import keys
from serving.choices import DeploymentState
from serving.models import ServingDeployment, ServingReplica
from tests.provisioning.gateway_process import until
from tests.serving.test_gateway import call, exits

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def endpoint(serving, gateway_redis):
    """A 2-replica endpoint whose offering scales to zero after an hour without calls, warned 15 minutes before."""
    IdlePolicy.objects.create(
        service=serving.service,
        action=IdleAction.SCALE_TO_ZERO,
        idle_minutes=60,
        warning_minutes=15,
        max_snoozes=1,
        snooze_minutes=30,
    )
    request = serving.order()
    assert request.state == RequestState.ACTIVE
    issued = keys.api_key_create(project=serving.team.project, name="chat-frontend", actor=serving.team.developer)
    return request, ServingDeployment.objects.get(request=request), issued.secret


def last_call_at(request):
    return TokenUsage.objects.filter(request=request).values_list("last_call_at", flat=True).first()


def running_allocations(request) -> int:
    return Allocation.objects.filter(request=request, state=AllocationState.ACTIVE).count()


def idle_down(request, run_on_commit, *, called_at) -> tuple[dict, dict]:
    """The sweep 50 minutes after the last call (warned), then 66 (the lead passed): scaled to zero."""
    with time_machine.travel(called_at + timedelta(minutes=50), tick=False):
        warned = run_on_commit(idle_services.idle_sweep).as_dict()
    with time_machine.travel(called_at + timedelta(minutes=66), tick=False):
        acted = run_on_commit(idle_services.idle_sweep).as_dict()
    return warned, acted


def test_an_idle_endpoint_is_warned_scaled_to_zero_and_its_next_calls_wake_it_once(
    endpoint, gateways, run_on_commit, mailbox, client
):
    request, deployment, secret = endpoint
    gateway = gateways(GATEWAY_WAKE_SECONDS="90")
    assert call(gateway, deployment, secret).status_code == 200
    _took, called_at = until(lambda: last_call_at(request), seconds=5, what="the gateway's flush")
    pids = list(ServingReplica.objects.filter(deployment=deployment).values_list("pid", flat=True))
    assert len(pids) == 2 and running_allocations(request) == 2

    with time_machine.travel(called_at + timedelta(minutes=50), tick=False):
        assert run_on_commit(idle_services.idle_sweep).as_dict()["warned"] == [request.pk]
        client.force_login(request.requester)
        page = client.get(f"/requests/{request.pk}/").content.decode()
        assert "Idle for 50 min — scales to zero replicas at" in page
    warning = request.events.get(code=EventCode.IDLE_WARNING)
    assert warning.message.startswith("Idle for 50 min: No calls through the gateway.")
    assert "Scales to zero replicas (woken by its next call) at" in warning.message
    assert [reason["code"] for reason in warning.data["reasons"]] == ["no_gateway_calls"]  # no readings: calls judge
    assert mailbox.wait_for(1)[-1]["Subject"] == f"Request #{request.pk} is idle and will be stopped"

    with time_machine.travel(called_at + timedelta(minutes=66), tick=False):
        assert run_on_commit(idle_services.idle_sweep).as_dict()["acted"] == [request.pk]
    acted = request.events.get(code=EventCode.IDLE_STOPPED)
    assert acted.message.startswith("Scaled to zero replicas (its route, keys and record stay")
    assert acted.data["action"] == "scale_to_zero"
    assert acted.data["reasons"][0]["details"]["last_call_at"] == called_at.isoformat()
    deployment.refresh_from_db()
    request.refresh_from_db()
    assert deployment.state == DeploymentState.SCALED_TO_ZERO and request.state == RequestState.ACTIVE
    assert running_allocations(request) == 0 and not deployment.replicas.exists()
    assert until(lambda: all(exits(pid) for pid in pids), seconds=10, what="the servers to stop")
    assert set(Allocation.objects.filter(request=request).values_list("release_reason", flat=True)) == {
        "scaled to zero: idle for 1 h 6 min after a warning"
    }
    page = client.get(f"/requests/{request.pk}/").content.decode()
    assert 'data-state="scaled_to_zero"' in page and 'id="endpoint-asleep"' in page

    # Three calls at once while it is at zero: one wake, all three answered by the one replica it starts.
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: call(gateway, deployment, secret), range(3)))
    assert [answer.status_code for answer in answers] == [200, 200, 200], answers[0].text
    assert all(answer.json()["usage"]["completion_tokens"] > 0 for answer in answers)
    assert request.events.filter(code=EventCode.SCALING_UP).count() == 1
    deployment.refresh_from_db()
    request.refresh_from_db()
    assert deployment.state == DeploymentState.SERVING and request.state == RequestState.ACTIVE
    assert running_allocations(request) == 1 and list(deployment.replicas.values_list("name", flat=True)) == [
        "replica-0"
    ]
    codes = list(request.events.order_by("pk").values_list("code", flat=True))
    woken = codes[codes.index(EventCode.IDLE_STOPPED) :]
    assert woken[:2] == [EventCode.IDLE_STOPPED, EventCode.SCALING_UP] and woken[-1] == EventCode.ACTIVE


def test_a_call_that_cannot_wait_for_the_wake_gets_503_with_retry_after_and_a_later_one_is_answered(
    endpoint, gateways, run_on_commit
):
    request, deployment, secret = endpoint
    gateway = gateways(GATEWAY_WAKE_SECONDS="0.05")
    assert call(gateway, deployment, secret).status_code == 200
    _took, called_at = until(lambda: last_call_at(request), seconds=5, what="the gateway's flush")
    warned, acted = idle_down(request, run_on_commit, called_at=called_at)
    assert warned["warned"] == acted["acted"] == [request.pk]
    until(lambda: call(gateway, deployment, secret).status_code == 503, seconds=5, what="the route at zero")

    refused = call(gateway, deployment, secret)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
    body = refused.json()
    assert body["code"] == "waking_up" and "scaled to zero" in body["message"]
    assert body["details"] == {"deployment": deployment.slug, "retry_after": 5}
    until(lambda: call(gateway, deployment, secret).status_code == 200, seconds=60, what="the woken replica")
    assert request.events.filter(code=EventCode.SCALING_UP).count() == 1
    assert running_allocations(request) == 1
