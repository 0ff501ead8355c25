"""GET /api/v1/requests/{id}/ shows what the request has used so far, as metering counts it (through
requests.hooks.REQUEST_USAGE, which metering registers)."""

from datetime import date

from metering.models import DailyUsage, TokenUsage
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
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost": "96.00",
        "cost_approved": f"{earlier.request.cost_estimate:.2f}",
        "currency": "USD",
    }
    assert _usage_of(api_as, running.request.requester, running.request_id) == {
        "card_hours": "4.0000",
        "energy_kwh": 0.0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost": "16.00",
        "cost_approved": f"{running.request.cost_estimate:.2f}",
        "currency": "USD",
    }


def test_a_served_models_tokens_so_far_are_beside_its_cost_on_the_api_and_the_page(frozen, world, api_as, client):
    allocation = bound(world, started=at("2026-11-20 10:00"))
    request = allocation.request
    for day, prompt, completion in ((date(2026, 11, 19), 100, 40), (date(2026, 11, 20), 900, 60)):
        for key_prefix in ("key-a", "key-b"):  # each key's calls are counted apart, then summed
            TokenUsage.objects.create(
                request=request,
                project=request.project,
                model="m",
                key_prefix=key_prefix,
                day=day,
                requests=1,
                prompt_tokens=prompt,
                completion_tokens=completion,
            )
    usage = _usage_of(api_as, request.requester, request.pk)
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["cost"]) == (2000, 200, "16.00")

    client.force_login(request.requester)
    page = client.get(f"/requests/{request.pk}/").content.decode()
    so_far = page.split('id="usage-so-far">', 1)[1].split("</dd>", 1)[0]
    assert so_far.startswith(f"16.00 USD of the {request.cost_estimate:,.2f} USD approved for its whole duration")
    assert "4 card-hours" in so_far and "2,000 + 200 tokens" in so_far


def test_a_request_that_never_held_an_allocation_has_no_usage(frozen, world, api_as):
    allocation = bound(world, started=at("2026-11-20 10:00"))
    request = allocation.request
    allocation.delete()
    assert _usage_of(api_as, request.requester, request.pk) is None
