"""One release pipeline: whichever way resources come back (a release through the API, expiry, a stale allocation,
a preemption, an isolated device), it ends in exactly one call of scheduling's allocation_free for the request."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.utils import timezone

from metering.selectors import request_usage
from provisioning import engine
from provisioning import services as provisioning_services
from provisioning.choices import RunKind, RunState
from provisioning.models import ProvisioningRun
from provisioning.services import ReleasePath, release_path
from provisioning.wiring import start_release
from requests import services as request_services
from requests.choices import EventCode, PriorityClass, RequestState
from requests.models import ResourceRequest
from requests.signals import request_releasing
from scheduling import cycle, reclaim, tasks
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device
from scheduling.services import device_isolate
from tenancy.models import MonthlyUsage
from tenancy.services import quota_set_priority_entitlement
from tests.requests.conftest import make_order
from tests.scheduling.inventory_helpers import active_request, allocate, node
from tests.scheduling.test_cycle import device_totals_match_bindings

pytestmark = pytest.mark.django_db


@pytest.fixture
def frees(monkeypatch):
    """The request ids of each allocation_free call, in order (every caller looks the service up at call time)."""
    calls = []
    free = reclaim.allocation_free

    def counted(*, request_ids, reason):
        calls.append(sorted(request_ids))
        return free(request_ids=request_ids, reason=reason)

    monkeypatch.setattr(reclaim, "allocation_free", counted)
    return calls


def freed_once(frees, request) -> bool:
    return [ids for ids in frees if request.pk in ids] == [[request.pk]]


def released_after_teardown(request) -> bool:
    request.refresh_from_db()
    release = ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE)
    return (
        request.state == RequestState.RELEASED
        and release.state == RunState.SUCCEEDED
        and list(release.steps.values_list("name", flat=True))[-1] == "return_capacity"
        and not Allocation.objects.filter(request=request, state=AllocationState.ACTIVE).exists()
    )


def test_a_release_through_the_api_tears_down_then_frees_once(compute, api_as, frees, run_on_commit):
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    response = run_on_commit(
        api_as(request.requester).post, f"/api/v1/requests/{request.pk}/release/", {"reason": "done"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert released_after_teardown(request) and freed_once(frees, request)
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_a_release_before_provisioning_began_frees_at_once_without_a_run(compute, api_as, frees, run_on_commit):
    request = request_services.request_submit(
        order=make_order(compute.shop, compute.team.project), requester=compute.team.developer
    )
    cycle.run_cycle()  # after-commit work (provisioning's start) does not run here: allocated, nothing built
    request.refresh_from_db()
    assert request.state == RequestState.ALLOCATED
    response = run_on_commit(
        api_as(request.requester).post, f"/api/v1/requests/{request.pk}/release/", {"reason": "done"}, format="json"
    )
    assert response.status_code == 200, response.content
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED and not request.provisioning_runs.exists()
    assert freed_once(frees, request)
    device_totals_match_bindings()


def test_expiry_tears_down_then_frees_once(compute, frees, run_on_commit):
    request = compute.order()
    with time_machine.travel(timezone.now() + timedelta(hours=request.duration_hours, minutes=1), tick=False):
        assert run_on_commit(tasks.reclaim_allocations) == 1
    assert released_after_teardown(request) and freed_once(frees, request)
    assert "expired" in request.events.get(code=EventCode.RELEASING).message


def test_a_stale_allocation_tears_down_then_frees_once(compute, frees, run_on_commit, settings):
    request = compute.order()
    Allocation.objects.filter(request=request).update(
        heartbeat_at=timezone.now() - timedelta(minutes=settings.ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES + 1)
    )
    assert run_on_commit(tasks.reclaim_allocations) == 1
    assert released_after_teardown(request) and freed_once(frees, request)
    assert "stale" in request.events.get(code=EventCode.RELEASING).message


def test_a_preemption_frees_once_then_tears_down(compute, frees, run_on_commit):
    quota_set_priority_entitlement(quota=compute.team.project.quota, max_priority=PriorityClass.CRITICAL, actor=None)
    victims = [compute.order(), compute.order()]  # standard: the node's four cards
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        winner = compute.order(priority=PriorityClass.CRITICAL)  # its cycle schedules the preemption
    assert winner.state == RequestState.QUEUED
    with time_machine.travel(start + timedelta(seconds=301), tick=False):
        run_on_commit(cycle.run_cycle)
    (victim,) = [request for request in victims if request.events.filter(code=EventCode.PREEMPTED).exists()]
    assert freed_once(frees, victim)
    teardown = ProvisioningRun.objects.get(request=victim, kind=RunKind.TEARDOWN)
    assert teardown.state == RunState.SUCCEEDED
    assert "return_capacity" not in teardown.steps.values_list("name", flat=True)  # freed before the teardown
    winner.refresh_from_db()
    assert winner.state == RequestState.ACTIVE
    device_totals_match_bindings()


def test_an_isolated_device_requeues_frees_once_then_tears_down(compute, frees, run_on_commit):
    request = compute.order()
    run_on_commit(device_isolate, device=Device.objects.get(uuid="GPU-n1-0"), reason="XID 79")
    assert freed_once(frees, request)
    assert ProvisioningRun.objects.get(request=request, kind=RunKind.TEARDOWN).state == RunState.SUCCEEDED
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE  # placed again on healthy cards
    device_totals_match_bindings()


def test_a_second_free_of_the_same_release_changes_nothing(compute, frees, run_on_commit):
    request = compute.order()
    with time_machine.travel(timezone.now() + timedelta(hours=request.duration_hours, minutes=1), tick=False):
        run_on_commit(tasks.reclaim_allocations)
    released = request.events.filter(code=EventCode.RELEASED).count()
    assert tasks.free_allocations([request.pk], "delivered twice") == 0
    assert request.events.filter(code=EventCode.RELEASED).count() == released == 1


def test_a_running_request_provisioning_never_built_is_freed_at_once(frees, run_on_commit):
    """Made active outside provisioning (stored history, an import): nothing to tear down, the release still ends."""
    request = active_request()
    allocate(request, list(node(devices=1).devices.all()))
    run_on_commit(request_services.request_release, request=request, actor=None, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED and not request.provisioning_runs.exists()
    assert freed_once(frees, request)
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_a_release_is_decided_in_one_place_tear_down_then_free_or_free_now(compute, frees, run_on_commit):
    """One receiver of request_releasing, one decision (provisioning.services.release_path), both branches."""
    sync, asynchronous = request_releasing._live_receivers(ResourceRequest)
    assert [*sync, *asynchronous] == [start_release]

    allocated = request_services.request_submit(
        order=make_order(compute.shop, compute.team.project), requester=compute.team.developer
    )
    cycle.run_cycle()  # after-commit work (provisioning's start) does not run here: allocated, nothing built
    allocated.refresh_from_db()
    assert allocated.state == RequestState.ALLOCATED
    assert release_path(request_id=allocated.pk) == ReleasePath.FREE_NOW
    run_on_commit(request_services.request_release, request=allocated, actor=None, reason="not needed")
    allocated.refresh_from_db()
    assert allocated.state == RequestState.RELEASED and not allocated.provisioning_runs.exists()
    assert freed_once(frees, allocated)

    built = compute.order()
    assert built.state == RequestState.ACTIVE
    assert release_path(request_id=built.pk) == ReleasePath.TEAR_DOWN
    run_on_commit(request_services.request_release, request=built, actor=None, reason="done")
    assert released_after_teardown(built) and freed_once(frees, built)
    runs = built.provisioning_runs.count()
    assert provisioning_services.release_start(request_id=built.pk, reason="delivered twice") is None
    assert built.provisioning_runs.count() == runs  # a second delivery starts nothing and changes nothing
    assert built.events.filter(code=EventCode.RELEASED).count() == 1


def test_card_hours_of_a_release_are_final_in_the_ledger_as_it_completes(compute, settings, run_on_commit):
    """The teardown waits out its host for an hour; the allocation's end (allocation_ended), not the release's start
    nor the five-minute refresh, brings its card-hours into the quota ledger."""
    settings.PROVISIONING_CHAIN_SECONDS = 0.0
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0.0
    start = datetime(2027, 1, 15, 9, 0, tzinfo=UTC)
    with time_machine.travel(start, tick=False):
        request = compute.order()
    assert request.state == RequestState.ACTIVE
    settings.PROVISIONING_FAULTS = [{"op": "stop_workload", "unavailable": True}]
    with time_machine.travel(start + timedelta(hours=2), tick=False):
        run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASING  # the host does not answer: the devices stay bound
    settings.PROVISIONING_FAULTS = []
    with time_machine.travel(start + timedelta(hours=3), tick=False):
        run_on_commit(engine.steps_resume_due)
        request.refresh_from_db()
        assert request.state == RequestState.RELEASED
        ledger = MonthlyUsage.objects.get(project=request.project, month=date(2027, 1, 1))
        assert ledger.card_hours == request_usage(request)["card_hours"] == Decimal(2 * 3)  # 2 cards for 3 hours
        assert ledger.running_card_hours == 0
