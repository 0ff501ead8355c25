"""The cycle's forecast: every waiting request's expected start, worked out once per cycle and stored with its queue
status (`ResourceRequest.queue_estimate`), so pages and the API read it for nothing.

The replay itself is pure (scheduling/engine/forecast.py); this module hands it the cycle's own state: the engine as
the cycle left it, the running work with its approved ends, the queue in the cycle's order, and how early ended work
ended (`selectors.early_end_ratios`: one indexed read). Requests that wait for anything but capacity (quota, a
backend, a shape no node has) get no time, only their reason."""

from datetime import UTC, datetime, timedelta

from django.conf import settings

from scheduling.engine import Demand, RunningAllocation
from scheduling.engine.forecast import TIMED_REASONS, EarlyEnds, Queued, Running, forecast, untimed
from scheduling.selectors import early_end_ratios


def queue_estimates(*, engine, allocations, expires, bindings, demands: list[Demand], hours, reasons, now) -> dict:
    """{request id: estimate data} for the requests the cycle leaves waiting (`reasons`, by request id).

    `engine` is the cycle's (`at_start`), `allocations` and `expires` what ran when it started and when each ends,
    `bindings` what it placed, `demands` its queue in order and `hours` each one's approved duration (by demand id)."""
    timed = [
        (demand, float(hours[demand.id]))
        for demand in demands
        if reasons.get(int(demand.id), {}).get("code") in TIMED_REASONS
    ]
    estimates = {}
    if timed:
        placed = [
            RunningAllocation(b.demand_id, b.node, b.devices, b.cpu_milli, b.memory_mib, started_at=now.timestamp())
            for b in bindings
        ]
        ends = {allocation.id: now + timedelta(hours=hours[allocation.id]) for allocation in placed}
        estimates = expected(
            engine_now=lambda: engine.at_start(placed),
            allocations=[*allocations, *placed],
            expires={**expires, **ends},
            queue=timed,
            now=now,
        )
    data = {int(demand_id): estimate for demand_id, estimate in estimates.items()}
    for request_id, reason in reasons.items():
        data.setdefault(request_id, untimed(reason["code"]).as_data())
    return data


def expected(*, engine_now, allocations, expires, queue: list[tuple[Demand, float]], now, wanted=None) -> dict:
    """{demand id: estimate data} of the queue (demands in queue order with their approved hours), or of the
    `wanted` ids in it, on an engine holding `allocations` (`engine_now()` gives a fresh one) that end as `expires`
    says (by request id; missing: no end). The first SCHEDULER_FORECAST_QUEUE are replayed."""
    limit = settings.SCHEDULER_FORECAST_QUEUE
    if not limit:
        return {}
    estimates = forecast(
        engine_now=engine_now,
        running=_running(allocations, expires),
        queue=[Queued(demand, hours) for demand, hours in queue],
        now=now,
        early_ends=EarlyEnds.of(early_end_ratios(limit=settings.SCHEDULER_FORECAST_HISTORY)),
        limit=limit,
    )
    return {
        demand_id: estimate.as_data()
        for demand_id, estimate in estimates.items()
        if wanted is None or demand_id in wanted
    }


def _running(allocations, expires) -> list[Running]:
    """Running work per request (a replicated request's allocations together), with its start and approved end."""
    by_request: dict[str, list[RunningAllocation]] = {}
    for allocation in allocations:
        by_request.setdefault(allocation.id, []).append(allocation)
    return [
        Running(tuple(held), datetime.fromtimestamp(held[0].started_at, UTC), expires.get(request_id))
        for request_id, held in by_request.items()
    ]
