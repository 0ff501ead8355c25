"""Expiry warnings (scheduling/reclaim.py warn_expiring): once, EXPIRY_WARNING_HOURS before the end of a running
request's term, or halfway through a term shorter than twice that; never for work still being set up or failed."""

from datetime import timedelta

import pytest
import time_machine

from requests.choices import EventCode, RequestState
from scheduling import cycle, reclaim
from scheduling.models import Allocation
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(shop, team, django_capture_on_commit_callbacks):  # noqa: F811
    """Submit an order of `hours` and let the scheduler and provisioning (simulated, instant) run: active."""
    add_node(shop.accelerator, cards=8)

    def place(hours: int):
        request = queued(shop, team, duration_hours=hours)
        with django_capture_on_commit_callbacks(execute=True):
            cycle.run_cycle()
        request.refresh_from_db()
        return request, Allocation.objects.get(request=request)

    return place


def warnings_of(request) -> list[str]:
    return list(request.events.filter(code=EventCode.EXPIRY_WARNING).values_list("message", flat=True))


def test_a_one_hour_order_is_warned_halfway_not_when_it_starts(placed):
    request, allocation = placed(1)
    assert request.state == RequestState.ACTIVE

    assert reclaim.warn_expiring() == 0  # before: warned the moment it started, the whole hour being "within 4 h"
    with time_machine.travel(allocation.term_started_at + timedelta(minutes=29), tick=False):
        assert reclaim.warn_expiring() == 0
    with time_machine.travel(allocation.term_started_at + timedelta(minutes=30), tick=False):
        assert (reclaim.warn_expiring(), reclaim.warn_expiring()) == (1, 0)

    assert warnings_of(request) == [
        f"Expires at {allocation.expires_at:%Y-%m-%d %H:%M} UTC; release or ask for an extension before then."
    ]


def test_a_term_of_twice_the_window_or_more_is_warned_the_window_before_its_end(placed, settings):
    settings.EXPIRY_WARNING_HOURS = 4
    request, allocation = placed(10)

    with time_machine.travel(allocation.expires_at - timedelta(hours=4, minutes=1), tick=False):
        assert reclaim.warn_expiring() == 0
    with time_machine.travel(allocation.expires_at - timedelta(hours=4), tick=False):
        assert reclaim.warn_expiring() == 1
    assert len(warnings_of(request)) == 1


def test_work_still_being_set_up_or_failed_is_not_warned(shop, team, settings, django_capture_on_commit_callbacks):  # noqa: F811
    add_node(shop.accelerator, cards=8)
    allocated = queued(shop, team, duration_hours=1)
    cycle.run_cycle()  # placed; its provisioning has not started (after-commit work not run)
    # A failed order whose cleanup has not given its devices back yet (the teardown keeps being retried).
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    settings.PROVISIONING_FAULTS = [
        {"op": "start_workload", "code": "image_broken", "message": "Broken.", "retryable": False},
        {"op": "stop_workload", "code": "node_busy", "message": "Busy.", "retryable": True},
    ]
    failed = queued(shop, team, duration_hours=1)
    with django_capture_on_commit_callbacks(execute=True):
        cycle.run_cycle()
    for request, state in ((allocated, RequestState.ALLOCATED), (failed, RequestState.FAILED)):
        request.refresh_from_db()
        assert request.state == state and Allocation.objects.get(request=request).state == "active"

    with time_machine.travel(Allocation.objects.get(request=failed).expires_at - timedelta(minutes=5), tick=False):
        assert reclaim.warn_expiring() == 0

    assert warnings_of(allocated) == warnings_of(failed) == []
