"""The cycle's forecast: every waiting request's expected start, worked out once per cycle and stored with its queue
status (`ResourceRequest.queue_estimate`), so pages and the API read it for nothing.

The replay itself is pure (scheduling/engine/forecast.py); this module hands it the cycle's own state (`Inputs`):
the running work with its approved ends, the queue in the cycle's order, how early ended work ended
(`selectors.early_end_ratios`: one indexed read) and the windows held ahead (the nodes planned for reservations not
begun and those of maintenance windows, each closed in the replay only while it can still keep work off), on the
engine as the cycle left it. Requests that wait for
anything but capacity (quota, a backend, a shape no node has) get no time, only their reason.

The cycle also stores its `Inputs` with its outcome (`CycleOutcome.forecast`), so that expected starts of work not
queued yet (the order preview, the approval inbox: scheduling/expected_start.py) are replayed from the same picture
with no query of their own."""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings

from scheduling.engine import Demand, RunningAllocation
from scheduling.engine.forecast import (
    MAINTENANCE,
    RESERVATION_AHEAD,
    TIMED_REASONS,
    EarlyEnds,
    HeldWindow,
    Queued,
    Running,
    forecast,
    untimed,
)
from scheduling.selectors import early_end_ratios


@dataclass(frozen=True)
class Inputs:
    """What a replay starts from: running work (with this cycle's placements), the timed queue in order with each
    one's aged rank (where new work goes in), the early-end ratios and the windows held ahead."""

    running: list[Running]
    queue: list[tuple[Queued, int]]
    early_ends: EarlyEnds
    windows: list[HeldWindow] = field(default_factory=list)


def cycle_inputs(
    *, allocations, expires, bindings, demands: list[Demand], hours, ranks, reasons, now, windows=()
) -> Inputs:
    """The cycle's state as the replay needs it: `allocations` and `expires` what ran when the cycle started and
    when each ends (by request id), `bindings` what it placed, `demands` its queue in order, `hours` and `ranks`
    each one's approved duration and aged rank (by demand id), `reasons` the waits it left (by request id),
    `windows` the nodes held ahead."""
    placed = placed_allocations(bindings, now)
    ends = {allocation.id: now + timedelta(hours=hours[allocation.id]) for allocation in placed}
    timed = [
        (Queued(demand, float(hours[demand.id])), ranks[demand.id])
        for demand in demands
        if reasons.get(int(demand.id), {}).get("code") in TIMED_REASONS
    ][: settings.SCHEDULER_FORECAST_QUEUE]
    history = early_end_ratios(limit=settings.SCHEDULER_FORECAST_HISTORY) if settings.SCHEDULER_FORECAST_QUEUE else []
    running = running_work([*allocations, *placed], {**expires, **ends})
    return Inputs(running, timed, _early_ends(history), list(windows))


def _early_ends(history: list[tuple[tuple, float]]) -> EarlyEnds:
    """The early-end ratios, all and per kind, of ended terms given as (kind, ratio)."""
    kinds: dict[tuple, list[float]] = {}
    for kind, ratio in history:
        kinds.setdefault(tuple(kind), []).append(ratio)
    return EarlyEnds.of([ratio for _kind, ratio in history], kinds)


def placed_allocations(bindings, now: datetime) -> list[RunningAllocation]:
    """What a cycle placed, as running work from `now`."""
    return [
        RunningAllocation(b.demand_id, b.node, b.devices, b.cpu_milli, b.memory_mib, started_at=now.timestamp())
        for b in bindings
    ]


def queue_estimates(*, engine_now, inputs: Inputs, reasons, now) -> dict[int, dict]:
    """{request id: estimate data} for the requests the cycle leaves waiting (`reasons`, by request id); those
    behind the replayed head read `beyond_forecast`, those waiting for anything but capacity `not_timed`."""
    queue = [queued for queued, _rank in inputs.queue]
    estimates = replay(engine_now=engine_now, inputs=inputs, queue=queue, now=now, tried_now=True)
    data = {int(demand_id): estimate for demand_id, estimate in estimates.items()}
    for request_id, reason in reasons.items():
        code = reason["code"]
        data.setdefault(request_id, untimed(code).as_data() if code not in TIMED_REASONS else _BEYOND)
        estimate = data[request_id]
        if code in HELD_WINDOW and estimate["likely"] is not None and estimate["code"] is None:
            # kept off a held node now (the replay tries it from the next moment on): the cycle's wait says which
            data[request_id] = {**estimate, "code": code, "reason": reason["message"]}
    return data


HELD_WINDOW = frozenset({RESERVATION_AHEAD, MAINTENANCE})
_BEYOND = {"earliest": None, "likely": None, "latest": None, "code": "beyond_forecast", "reason": None}


def replay(*, engine_now, inputs: Inputs, queue: list[Queued], now, wanted=None, tried_now=False) -> dict[str, dict]:
    """{demand id: estimate data} of `queue` (or of its `wanted` ids: the replay stops once they are placed) on
    engines from `engine_now()` holding the inputs' running work; `tried_now`: the cycle just left the queue
    waiting at `now` (engine.forecast.forecast)."""
    if not queue or not settings.SCHEDULER_FORECAST_QUEUE:
        return {}
    estimates = forecast(
        engine_now=engine_now,
        running=inputs.running,
        queue=queue,
        now=now,
        early_ends=inputs.early_ends,
        limit=len(queue),
        wanted=wanted,
        tried_now=tried_now,
        windows=inputs.windows,
    )
    return {demand_id: estimate.as_data() for demand_id, estimate in estimates.items()}


def running_work(allocations, expires) -> list[Running]:
    """Running work per request (a replicated request's allocations together), with its start and approved end."""
    by_request: dict[str, list[RunningAllocation]] = {}
    for allocation in allocations:
        by_request.setdefault(allocation.id, []).append(allocation)
    return [
        Running(tuple(held), datetime.fromtimestamp(held[0].started_at, UTC), expires.get(request_id))
        for request_id, held in by_request.items()
    ]


# -- stored with the cycle's outcome ----------------------------------------------------------------------------


def stored(inputs: Inputs) -> dict:
    """The inputs as JSON: per running allocation (request id, node, devices, cores, memory, start and end as
    timestamps), per queued demand its fields, hours and rank, per ended term its kind and early-end ratio, per
    window held its start, end, nodes, code and label."""
    return {
        "running": [
            [a.id, a.node, [list(device) for device in a.devices], a.cpu_milli, a.memory_mib, a.started_at, _ts(w.ends)]
            for w in inputs.running
            for a in w.allocations
        ],
        "queue": [[_demand_data(queued.demand), queued.hours, rank] for queued, rank in inputs.queue],
        "history": [[*kind, ratio] for kind, ratios in inputs.early_ends.by_kind.items() for ratio in ratios],
        "windows": [[_ts(w.start), _ts(w.end), sorted(w.nodes), w.code, w.label] for w in inputs.windows],
    }


def from_stored(data: dict) -> Inputs:
    allocations, expires = [], {}
    for request_id, node, devices, cpu, memory, started, ends in data.get("running", []):
        allocations.append(
            RunningAllocation(request_id, node, tuple(map(tuple, devices)), cpu, memory, started_at=started)
        )
        expires[request_id] = None if ends is None else datetime.fromtimestamp(ends, UTC)
    queue = [(Queued(_demand(fields), hours), rank) for fields, hours, rank in data.get("queue", [])]
    history = [(tuple(row[:-1]), row[-1]) for row in data.get("history", [])]
    windows = [
        HeldWindow(datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), frozenset(nodes), code, label)
        for start, end, nodes, code, label in data.get("windows", [])
    ]
    return Inputs(running_work(allocations, expires), queue, _early_ends(history), windows)


def _ts(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


_DEMAND_FIELDS = ("id", "count", "share", "slice_profile", "cpu_milli", "memory_mib", "priority", "preemptible")


def _demand_data(demand: Demand) -> dict:
    return {
        **{name: getattr(demand, name) for name in _DEMAND_FIELDS},
        "replicas": demand.replicas,
        "models": sorted(demand.models),
        "needs": sorted(demand.needs),
    }


def _demand(fields: dict) -> Demand:
    return Demand(
        **{name: fields[name] for name in _DEMAND_FIELDS},
        replicas=fields["replicas"],
        models=frozenset(fields["models"]),
        needs=frozenset(fields["needs"]),
    )
