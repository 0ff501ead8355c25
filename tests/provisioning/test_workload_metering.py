"""Card-hours of a compute order count from its workload's start on the backend (its readiness), not from the
scheduler's binding: a job that never started is charged nothing (on the simulated backend here;
test_slurm_drains.py shows a Slurm job that never ran)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from metering.selectors import request_usage
from provisioning import engine
from requests import services as request_services
from requests.choices import RequestState
from scheduling.models import Allocation

pytestmark = pytest.mark.django_db

ORDERED = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
NOT_READY = [{"op": "workload_ready", "result": {"ready": False}}]  # the workload never answers its probe


@pytest.fixture
def slow_to_start(compute, settings):
    """The shop's 2-card order (4.00 per card and hour), placed and provisioning at 08:00, its workload not up."""
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0  # readiness polls go back to the sweeper, as the clock stands still
    settings.PROVISIONING_FAULTS = NOT_READY
    with time_machine.travel(ORDERED, tick=False):
        request = compute.order()
    assert request.state == RequestState.PROVISIONING
    return request


def test_a_workload_that_never_started_is_charged_nothing(slow_to_start, run_on_commit):
    with time_machine.travel(ORDERED + timedelta(hours=3), tick=False):
        run_on_commit(
            request_services.request_release, request=slow_to_start, actor=slow_to_start.requester, reason="gave up"
        )
        slow_to_start.refresh_from_db()
        assert slow_to_start.state == RequestState.RELEASED
        usage = request_usage(slow_to_start)

    assert (usage["card_hours"], usage["cost"]) == (Decimal(0), Decimal(0))  # three hours held, nothing ran


def test_card_hours_count_from_the_workload_s_start(slow_to_start, settings, run_on_commit):
    settings.PROVISIONING_FAULTS = []
    with time_machine.travel(ORDERED + timedelta(hours=1), tick=False):
        run_on_commit(engine.steps_resume_due)
        slow_to_start.refresh_from_db()
        assert slow_to_start.state == RequestState.ACTIVE
    allocation = Allocation.objects.get(request=slow_to_start)
    assert (allocation.started_at, allocation.workload_started_at) == (ORDERED, ORDERED + timedelta(hours=1))

    with time_machine.travel(ORDERED + timedelta(hours=3), tick=False):
        usage = request_usage(slow_to_start)

    assert (usage["card_hours"], usage["cost"]) == (Decimal("4.0000"), Decimal("16.00"))  # 2 hours x 2 cards
