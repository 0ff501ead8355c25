"""The control plane's half of scale to zero, on the database: an endpoint scaled down holds nothing and keeps its
record; a wake checks the quota as it stands, asks once for one replica through the queue, the scheduler and
provisioning, however often it is asked; released at zero, its route goes. While its servers stop no lock is held, a
server that does not stop keeps its cards until the sweeper stops it, and a wake or a release meanwhile waits for
them or takes over. (The gateway's half, with a real gateway process: test_scale_to_zero.py.)"""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
import time_machine
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from config.errors import Conflict
from provisioning import tasks
from provisioning.drivers.base import StepError
from provisioning.drivers.simulated import SimulatedHost
from provisioning.scaling import endpoint_scale_to_zero
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.models import ResourceRequest
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


# --- While the servers stop ----------------------------------------------------------------------------------------


@pytest.fixture
def stops(monkeypatch):
    """The stand-in host's stop of an inference server, with `during` run inside each stop, the host refusing to
    stop the processes in `refused`, and the pids it signalled in `signalled` (in order)."""
    hooks = SimpleNamespace(during=lambda: None, refused=set(), signalled=[])
    stop = SimulatedHost.stop_inference

    def stop_inference(host, target, pid):
        hooks.during()
        if pid in hooks.refused:
            raise StepError("host_refused", f"The host refused to stop process {pid}.", retryable=False)
        if pid is not None:  # the host signals nothing for a replica that has no process
            hooks.signalled.append(pid)
        return stop(host, target, pid)

    monkeypatch.setattr(SimulatedHost, "stop_inference", stop_inference)
    return hooks


def after_the_grace():
    return time_machine.travel(timezone.now() + timedelta(seconds=settings.PROVISIONING_RELEASE_GRACE_SECONDS + 1))


def test_a_server_that_does_not_stop_keeps_its_cards_with_the_reason_until_the_sweeper_stops_it(
    serving, stops, run_on_commit
):
    request = serving.order()
    deployment = ServingDeployment.objects.get(request=request)
    first, second = deployment.replicas.order_by("name")
    stops.refused = {first.pid}
    scaled = run_on_commit(endpoint_scale_to_zero, request_id=request.pk, reason="scaled to zero: idle")
    assert not scaled["scaled_to_zero"] and list(scaled["stopped"]) == ["replica-1"]
    assert scaled["allocations_returned"] == [second.allocation_id]  # the stopped one's cards go back
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.SCALING_TO_ZERO and snapshot_load().routes[deployment.slug].asleep
    kept = deployment.replicas.get()
    assert (kept.name, kept.pid, kept.allocation.state) == ("replica-0", first.pid, AllocationState.ACTIVE)
    assert kept.last_error == f"The host refused to stop process {first.pid}." and not kept.healthy
    [event] = request.events.filter(code=EventCode.REPLICA_NOT_STOPPED)
    assert event.data["reasons"] == [
        {
            "code": "host_refused",
            "message": kept.last_error,
            "details": {"replica": "replica-0", "node": "n1", "pid": first.pid},
        }
    ]
    assert "keeps its cards until it stops" in event.message

    assert run_on_commit(tasks.start_stranded_runs)["scale_downs_resumed"] == []  # within the grace period
    with after_the_grace():
        assert run_on_commit(tasks.start_stranded_runs)["scale_downs_resumed"] == [request.pk]  # refused again
        assert request.events.filter(code=EventCode.REPLICA_NOT_STOPPED).count() == 1  # the same reason, once
        stops.refused = set()
        assert run_on_commit(tasks.start_stranded_runs)["scale_downs_resumed"] == [request.pk]
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.SCALED_TO_ZERO and not deployment.replicas.exists()
    assert active_allocations(request) == 0
    assert Allocation.objects.get(pk=first.allocation_id).release_reason == "scaled to zero: resumed by the sweeper"


def test_released_after_a_server_did_not_stop_the_teardown_stops_it_before_its_cards_go_back(
    serving, stops, run_on_commit
):
    request = serving.order()
    deployment = ServingDeployment.objects.get(request=request)
    _first, second = deployment.replicas.order_by("name")
    stops.refused = {second.pid}
    scaled = run_on_commit(endpoint_scale_to_zero, request_id=request.pk, reason="scaled to zero: idle")
    # replica-0 stopped, but keeps the run's first allocation while replica-1 runs: a release tears down on it.
    assert scaled["allocations_returned"] == [] and active_allocations(request) == 2
    assert dict(deployment.replicas.values_list("name", "pid")) == {"replica-0": None, "replica-1": second.pid}

    stops.refused, stops.signalled = set(), []
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED and active_allocations(request) == 0
    assert stops.signalled == [second.pid]  # the release's teardown stopped it (replica-0 has no process left)
    assert Allocation.objects.filter(request=request, release_reason="done").count() == 2


def test_a_call_while_its_servers_stop_wakes_it_once_they_have(serving, stops, run_on_commit):
    request = serving.order()
    deployment = ServingDeployment.objects.get(request=request)
    answers = []
    stops.during = lambda: answers.append(deployment_wake(deployment_id=deployment.pk))
    scaled = run_on_commit(endpoint_scale_to_zero, request_id=request.pk, reason="scaled to zero: idle")
    # No replica asked for while a server still runs on its cards; once both stopped, woken at once (the woken
    # replica's start, which stops a half-started server first, calls a third time).
    assert answers == [DeploymentState.SCALING_TO_ZERO, DeploymentState.SCALING_TO_ZERO, DeploymentState.WAKING]
    assert scaled["scaled_to_zero"] and len(scaled["allocations_returned"]) == 2
    deployment.refresh_from_db()
    request.refresh_from_db()
    assert deployment.state == DeploymentState.SERVING and not deployment.wake_requested
    assert request.serving_replicas == 1 and active_allocations(request) == 1
    assert request.events.filter(code=EventCode.SCALING_UP).count() == 1


def test_a_release_while_its_servers_stop_takes_over_and_frees_the_cards_after_its_own_teardown(
    serving, stops, run_on_commit
):
    request = serving.order()

    def release_once():
        if ResourceRequest.objects.get(pk=request.pk).state == RequestState.ACTIVE:
            request_services.request_release(request=request, actor=request.requester, reason="done")

    stops.during = release_once
    scaled = run_on_commit(endpoint_scale_to_zero, request_id=request.pk, reason="scaled to zero: idle")
    assert not scaled["scaled_to_zero"] and scaled["allocations_returned"] == []
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED and active_allocations(request) == 0
    assert ServingDeployment.objects.get(request=request).state == DeploymentState.STOPPED
    assert "scaled to zero: idle" not in set(
        Allocation.objects.filter(request=request).values_list("release_reason", flat=True)
    )


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_no_transaction_is_open_and_no_row_locked_while_a_server_stops(serving, stops, run_on_commit):
    request = serving.order()

    def lock_from_another_connection() -> str:
        try:
            with transaction.atomic():
                ResourceRequest.objects.select_for_update(nowait=True).get(pk=request.pk)
                ServingDeployment.objects.select_for_update(nowait=True).get(request=request.pk)
            return "locked"
        except DatabaseError as error:
            return str(error)
        finally:
            connection.close()

    seen = []

    def during():
        with ThreadPoolExecutor(1) as other:
            seen.append((connection.in_atomic_block, other.submit(lock_from_another_connection).result()))

    stops.during = during
    scaled = run_on_commit(endpoint_scale_to_zero, request_id=request.pk, reason="scaled to zero: idle")
    assert seen == [(False, "locked"), (False, "locked")]
    assert scaled["scaled_to_zero"] and len(scaled["allocations_returned"]) == 2
