"""GET /api/v1/requests/{id}/ shows what the request has used so far, as metering counts it (through
requests.hooks.REQUEST_USAGE, which metering registers)."""

from datetime import date

from metering.models import DailyUsage
from tests.metering.conftest import at, bound

REQUESTS = "/api/v1/requests/"


def _usage_of(api_as, user, request_id):
    response = api_as(user).get(f"{REQUESTS}{request_id}/")
    assert response.status_code == 200, response.content
    return response.json()["usage"]


def test_detail_shows_card_hours_energy_and_cost_so_far(frozen, world, api_as):
    # Two cards at 4.00 per card and hour: 12 hours released yesterday, then 2 hours of a second, running one.
    earlier = bound(world, started=at("2026-11-19 12:00"), released=at("2026-11-20 00:00"))
    DailyUsage.objects.create(
        allocation=earlier,
        day=date(2026, 11, 19),
        accelerator_model=world.model,
        samples=720,
        device_samples=1440,
        utilization_sum=1440 * 50.0,
        busy_cards_p95=1.0,
        memory_sum_mb=720 * 1024.0,
        memory_p95_mb=1024.0,
        memory_max_mb=1024.0,
        energy_kwh=3.25,
        updated_at=at("2026-11-20 00:00"),
    )
    running = bound(world, started=at("2026-11-20 10:00"), devices=list(world.node.devices.order_by("index"))[2:])

    assert _usage_of(api_as, earlier.request.requester, earlier.request_id) == {
        "card_hours": "24.0000",
        "energy_kwh": 3.25,
        "cost": "96.00",
        "currency": "USD",
    }
    assert _usage_of(api_as, running.request.requester, running.request_id) == {
        "card_hours": "4.0000",
        "energy_kwh": 0.0,
        "cost": "16.00",
        "currency": "USD",
    }


def test_a_request_that_never_held_an_allocation_has_no_usage(frozen, world, api_as):
    allocation = bound(world, started=at("2026-11-20 10:00"))
    request = allocation.request
    allocation.delete()
    assert _usage_of(api_as, request.requester, request.pk) is None
