"""The control plane's half of scale to zero, on the database: an endpoint scaled down holds nothing and keeps its
record; a wake checks the quota as it stands, asks once for one replica through the queue, the scheduler and
provisioning, however often it is asked; released at zero, its route goes. (The gateway's half, with a real gateway
process: test_scale_to_zero.py.)"""

from datetime import timedelta
from decimal import Decimal

import pytest

from config.errors import Conflict
from provisioning.scaling import endpoint_scale_to_zero
from requests import services as request_services
from requests.choices import EventCode, RequestState
from scheduling.choices import AllocationState
from scheduling.models import Allocation
from scheduling.reclaim import reclaim_expired
from serving.choices import DeploymentState
from serving.deployments import deployment_wake
from serving.models import ServingDeployment
from serving.routes import snapshot_load

pytestmark = pytest.mark.django_db


@pytest.fixture
def at_zero(serving, run_on_commit):
    request = serving.order()
    scaled = run_on_commit(endpoint_scale_to_zero, request_id=request.pk, reason="scaled to zero: idle")
    assert scaled["scaled_to_zero"] and len(scaled["allocations_returned"]) == 2 and len(scaled["stopped"]) == 2
    return request, ServingDeployment.objects.get(request=request)


def active_allocations(request) -> int:
    return Allocation.objects.filter(request=request, state=AllocationState.ACTIVE).count()


def test_at_zero_it_holds_nothing_and_keeps_its_route_for_the_gateways(at_zero, run_on_commit):
    request, deployment = at_zero
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE and active_allocations(request) == 0
    assert deployment.state == DeploymentState.SCALED_TO_ZERO and deployment.scaled_to_zero_at is not None
    route = snapshot_load().routes[deployment.slug]
    assert route.asleep and route.replicas == []
    again = run_on_commit(endpoint_scale_to_zero, request_id=request.pk, reason="again")
    assert again == {"scaled_to_zero": False}


def test_a_wake_asks_once_for_one_replica_through_the_queue(at_zero, run_on_commit):
    request, deployment = at_zero
    # Waking when it commits; then the cycle places the replica and provisioning starts it (tasks run inline here).
    assert run_on_commit(deployment_wake, deployment_id=deployment.pk) == DeploymentState.WAKING
    assert deployment_wake(deployment_id=deployment.pk) == DeploymentState.SERVING  # a second ask wakes nothing
    request.refresh_from_db()
    deployment.refresh_from_db()
    assert request.state == RequestState.ACTIVE and request.serving_replicas == 1
    assert active_allocations(request) == 1 and deployment.replicas.get().healthy
    [woken] = request.events.filter(code=EventCode.SCALING_UP)
    assert woken.data == {"deployment": deployment.slug, "replicas": 1}
    assert list(request.events.filter(pk__gt=woken.pk).order_by("pk").values_list("code", flat=True)[:1]) == [
        EventCode.ALLOCATED
    ]
    route = snapshot_load().routes[deployment.slug]
    assert not route.asleep and [replica.name for replica in route.replicas] == ["replica-0"]


def test_a_quota_lowered_while_it_slept_refuses_the_wake_with_the_dimension(at_zero, serving):
    request, deployment = at_zero
    quota = serving.team.project.quota
    quota.gpus = Decimal(1)  # the endpoint ordered two cards
    quota.save()
    with pytest.raises(Conflict) as refused:
        deployment_wake(deployment_id=deployment.pk)
    assert refused.value.code == "quota_exceeded"
    assert [reason["dimension"] for reason in refused.value.details["reasons"]] == ["gpus"]
    deployment.refresh_from_db()
    request.refresh_from_db()
    assert deployment.state == DeploymentState.SCALED_TO_ZERO and request.state == RequestState.ACTIVE


def test_released_at_zero_its_route_goes(at_zero, run_on_commit):
    request, deployment = at_zero
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    deployment.refresh_from_db()
    assert request.state == RequestState.RELEASED and deployment.state == DeploymentState.STOPPED
    assert deployment.slug not in snapshot_load().routes


def test_a_woken_replica_continues_the_term_its_first_allocation_began(at_zero, run_on_commit):
    request, deployment = at_zero
    began = Allocation.objects.filter(request=request).earliest("term_started_at").term_started_at
    run_on_commit(deployment_wake, deployment_id=deployment.pk)
    woken = Allocation.objects.get(request=request, state=AllocationState.ACTIVE)
    assert woken.term_started_at == began  # scaling to zero and back never stretches the approved duration


def test_asleep_past_its_term_it_is_released_as_expired(at_zero, run_on_commit):
    request, deployment = at_zero
    began = Allocation.objects.filter(request=request).earliest("term_started_at").term_started_at
    term_end = began + timedelta(hours=request.duration_hours)
    assert run_on_commit(reclaim_expired, now=term_end - timedelta(minutes=1)) == {}
    assert run_on_commit(reclaim_expired, now=term_end) == {request.pk: "released"}
    request.refresh_from_db()
    deployment.refresh_from_db()
    assert request.state == RequestState.RELEASED and deployment.state == DeploymentState.STOPPED
    assert request.events.filter(code=EventCode.RELEASING, message__contains="expired").exists()
