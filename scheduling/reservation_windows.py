"""Advance reservations on the capacity side (the order side is requests/reservations.py, the queue side
scheduling/reservations.py).

- `held_ends`: when each running request of some projects ends (its approved end), for admission's "work expected to
  still run at the window's start".
- `earliest_window`: the first start at or after the asked one at which the order's window fits the capacity: from
  the last cycle's picture (what runs on each node, with each request's approved end: the forecast's inputs), with
  the running work that ended by then given back, every held reservation overlapping the window placed first and
  the nodes of maintenance windows overlapping it closed.
  Capacity only frees up inside a window (nothing new starts in it but reservations, all placed), so a window that
  fits at its start fits throughout. The candidate starts are the asked one and every moment running work or a held
  reservation ends, up to the horizon.
"""

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db.models import Max
from django.utils import timezone

from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.reservations import Window, horizon_end
from scheduling import backends, forecasting
from scheduling.choices import AllocationState
from scheduling.cycle import demand_of, load_snapshot
from scheduling.engine import Demand, PlacementEngine
from scheduling.engine.model import Binding
from scheduling.engine.place import place_in_order
from scheduling.estimate import PREVIEW_ID, order_demand, order_models
from scheduling.expected_start import decoded_inputs
from scheduling.models import ENDS_AT, Allocation
from scheduling.outcome import last_outcome
from scheduling.reservations import maintenance_plans, said

# Approved reservations hold their window's capacity (pending ones do not yet).
HELD_STATES = (RequestState.APPROVED, RequestState.QUEUED)
MAX_CANDIDATES = 500  # starts an earliest-window search tries before it says none fits in the horizon


def held_ends(project_ids: list[int]) -> dict[int, datetime | None]:
    """{request id: the approved end of its term} for the requests of these projects holding devices (one query)."""
    return dict(
        Allocation.objects.filter(state=AllocationState.ACTIVE, request__project_id__in=project_ids)
        .values("request_id")
        .annotate(ends=Max(ENDS_AT))
        .values_list("request_id", "ends")
    )


def earliest_window(order, sizing, start: datetime, hours: int) -> dict:
    """{start, fits_asked, code, message}: the earliest start at or after `start` whose window of `hours` fits."""
    models = order_models(order)
    what = order.spec.name if order.spec is not None else ", ".join(model.name for model in models)
    outcome = last_outcome()
    if outcome is None or not outcome.forecast:
        return {
            "start": start.isoformat(),
            "fits_asked": True,
            "code": "capacity_not_checked",
            "message": "No scheduling cycle has run yet: the window's capacity is not checked.",
        }
    demand = order_demand(order, sizing, models)
    if demand.nodes > 1 and not backends.runs_multi_node():  # as the cycle, which would keep it waiting
        reason = backends.multi_node_reason(nodes=demand.nodes)
        return {
            "start": None,
            "fits_asked": False,
            "code": reason["code"],
            "message": f"No window can hold {demand.nodes} nodes at once: no node here has a backend that runs "
            f"multi-node work ({', '.join(reason['numbers']['backends'])}).",
        }
    engine_at, running = _picture(demand, outcome)
    now = timezone.now()
    reservations = _held_reservations(before=horizon_end(now))
    maintenance = maintenance_plans(now=now, until=horizon_end(now))
    for moment in _candidates(start, hours, running, reservations, maintenance):
        window = Window(moment, hours)
        engine = engine_at()
        for node in {node for plan in maintenance if plan.overlaps(window.start, window.end) for node in plan.nodes}:
            engine.close_node(node)
        if _fits(engine, demand, window, running, reservations):
            fits_asked = moment == start
            return {
                "start": moment.isoformat(),
                "fits_asked": fits_asked,
                "code": "window_free" if fits_asked else "window_taken",
                "message": (f"The window from {said(start)} is free for {what}." if fits_asked else "")
                + f"{'' if fits_asked else 'That window is taken. '}Earliest free window for {what}: {said(moment)}.",
            }
    return {
        "start": None,
        "fits_asked": False,
        "code": "no_window_in_horizon",
        "message": f"No window of {hours} h for {what} is free before the reservation horizon ends.",
    }


def _picture(demand: Demand, outcome) -> tuple[Callable[[], PlacementEngine], list]:
    """What the search starts from: a fresh engine holding the running work, and that work with its approved ends.
    The last cycle's outcome (no query) for one node; a gang needs the racks and blocks its members must share,
    which the outcome does not keep, so it reads the cluster whole (five queries, gang reservations only)."""
    if demand.nodes == 1:
        return (lambda: outcome.engine_for(demand)), decoded_inputs(outcome).running
    cluster = load_snapshot()
    base = PlacementEngine(cluster.snapshot, workload=[demand])
    running = forecasting.running_work(cluster.snapshot.allocations, cluster.expires)
    return base.fork, running


def _candidates(start: datetime, hours: int, running, reservations, maintenance) -> list[datetime]:
    latest = horizon_end(timezone.now()) - timedelta(hours=hours)
    ends = {work.ends for work in running if work.ends is not None}
    ends |= {Window(request.reserved_start, request.duration_hours).end for request, _demand in reservations}
    ends |= {plan.end for plan in maintenance}
    later = sorted(moment for moment in ends if start < moment <= latest)
    return [start, *later][:MAX_CANDIDATES] if start <= latest else []


def _fits(engine, demand: Demand, window: Window, running, reservations) -> bool:
    for work in running:
        if work.ends is not None and work.ends <= window.start:
            for allocation in work.allocations:
                engine.release(_binding(allocation))
    overlapping = [
        held
        for request, held in reservations
        if window.overlaps(request.reserved_start, Window(request.reserved_start, request.duration_hours).end)
    ]
    result = place_in_order(engine, [*overlapping, demand], backfill=True)
    return any(binding.demand_id == PREVIEW_ID for binding in result.bindings)


def _binding(allocation) -> Binding:
    return Binding(allocation.id, allocation.node, allocation.devices, allocation.cpu_milli, allocation.memory_mib)


def _held_reservations(*, before: datetime) -> list[tuple[ResourceRequest, Demand]]:
    """Approved reservations not begun yet (begun ones run, and count among the running work), with their demand."""
    rows = ResourceRequest.objects.filter(
        state__in=HELD_STATES, reserved_start__isnull=False, reserved_start__lt=before
    ).only("pk", "priority", "cpu_cores", "memory_gb", "approved_spec", "reserved_start", "duration_hours")
    return [(request, demand_of(request)) for request in rows if request.approved_spec]
