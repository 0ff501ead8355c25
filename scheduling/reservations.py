"""Advance reservations in the queue (the order side is requests/reservations.py, the capacity side
scheduling/reservation_windows.py): a queued reservation whose window has not begun waits, with a reason that says
when it starts, and the cycle starts it at its start and not before. Its expected start is its start.

Holding: each cycle plans the nodes every reservation not begun will run on (`plan_nodes`: placed at its start with
the running work that has ended by then given back), closes them to its queue, then lets the waiting work onto them
only where it ends before the reservation starts (`backfill_planned`); work that would still run then waits with
`reservation_ahead`, naming the reservation and its start. Reservations are never preempted (their allocations are
not preemptible)."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from requests.models import ResourceRequest
from scheduling.engine.backfill import CROWDED_OUT
from scheduling.engine.model import INSUFFICIENT_HEALTHY_CAPACITY, Binding, Pending, RunningAllocation
from scheduling.models import MaintenanceWindow

RESERVATION_NOT_DUE = "reservation_not_due"  # the queue reason of a reservation before its window
# The queue reason of work kept off a planned node: it would still run there when the reservation starts.
RESERVATION_AHEAD = "reservation_ahead"
# ... and off a node in maintenance now, or when its maintenance window starts.
MAINTENANCE = "maintenance"
MAX_PLANNED = 100  # reservations a cycle plans nodes for, the soonest first
# Waits that the planned nodes may end: crowded out, or every node with room closed (the planned ones are).
_MAY_BACKFILL = frozenset({*CROWDED_OUT, INSUFFICIENT_HEALTHY_CAPACITY})


def said(moment: datetime) -> str:
    return f"{moment:%a %d %b %H:%M} UTC"


def not_due(queue: list[ResourceRequest], now: datetime) -> dict[int, dict]:
    """The queued reservations whose window has not begun, each with its reason (code, message, numbers)."""
    return {
        request.pk: {
            "code": RESERVATION_NOT_DUE,
            "message": f"Reserved from {said(request.reserved_start)}; it starts then.",
            "numbers": {"start": request.reserved_start.isoformat(), "hours": request.duration_hours},
        }
        for request in queue
        if request.reserved_start is not None and request.reserved_start > now
    }


def note_plans(reasons: dict[int, dict], plans: list["Plan"]) -> None:
    """Each planned reservation's wait names the nodes planned for it (in place): what the calendar shows."""
    for plan in plans:
        reason = reasons[plan.request_id]  # reservations' plans only
        nodes = sorted(plan.nodes)
        reason["numbers"] = {**reason["numbers"], "nodes": nodes}
        where = f" on {', '.join(nodes)}" if nodes else "; no node is free for it then yet"
        reason["message"] = reason["message"].removesuffix("; it starts then.") + f"{where}; it starts then."


def not_due_estimates(reasons: dict[int, dict]) -> dict[int, dict]:
    """A reservation not begun is expected to start at its start, exactly."""
    return {
        pk: {"earliest": start, "likely": start, "latest": start, "code": None, "reason": None}
        for pk, reason in reasons.items()
        if reason["code"] == RESERVATION_NOT_DUE
        for start in [reason["numbers"]["start"]]
    }


# -- holding: planned nodes and maintenance ----------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Whole nodes held for a window: the nodes a reservation not begun will run on (worked out again each cycle;
    whole nodes, as a Slurm reservation holds them), or the nodes of an operator's maintenance window."""

    start: datetime
    end: datetime
    nodes: frozenset[str]
    request_id: int | None = None  # the reservation's; None: a maintenance window
    held: tuple[RunningAllocation, ...] = ()  # a reservation's placement at its start; empty: no node free then
    maintenance: str = ""  # a maintenance window's reason

    def overlaps(self, start: datetime, end: datetime) -> bool:
        return self.start < end and self.end > start


def maintenance_plans(*, now: datetime, until: datetime) -> list[Plan]:
    """The maintenance windows not over that start before `until` (later ones hold nothing any demand in view would
    still run into), one query."""
    windows: dict[int, tuple] = {}
    nodes: dict[int, set[str]] = {}
    for pk, start, end, reason, node in MaintenanceWindow.objects.filter(
        ends_at__gt=now, starts_at__lt=until
    ).values_list("pk", "starts_at", "ends_at", "reason", "nodes__name"):
        windows[pk] = (start, end, reason)
        if node is not None:
            nodes.setdefault(pk, set()).add(node)
    return [
        Plan(start, end, frozenset(nodes.get(pk, ())), maintenance=reason)
        for pk, (start, end, reason) in windows.items()
    ]


def plan_nodes(*, start_engine, running, expires, not_due_requests, closed, maintenance, demand_of) -> list[Plan]:
    """Each reservation not begun (the first MAX_PLANNED by start), placed at its start on the cycle's start state
    (`start_engine`, frozen; forked here) with the running work that has ended by then given back, the plans before
    it that overlap its window held and the nodes of `maintenance` windows overlapping it closed. `closed`: nodes no
    work goes to (a backend that does not answer)."""
    plans: list[Plan] = []
    for request in sorted(not_due_requests, key=lambda request: request.reserved_start)[:MAX_PLANNED]:
        start = request.reserved_start
        end = start + timedelta(hours=request.duration_hours)
        probe = start_engine.fork()
        for name in {*closed, *(node for plan in maintenance if plan.overlaps(start, end) for node in plan.nodes)}:
            probe.close_node(name)
        for allocation in running:
            ends = expires.get(allocation.id)
            if ends is not None and ends <= start:
                probe.release(_binding(allocation))
        probe.hold(allocation for plan in plans if plan.overlaps(start, end) for allocation in plan.held)
        placed = probe.place_one(demand_of(request))
        held = () if isinstance(placed, Pending) else tuple(_allocation(binding) for binding in placed)
        plans.append(Plan(start, end, frozenset(a.node for a in held), request_id=request.pk, held=held))
    return plans


def backfill_planned(*, engine, result, plans: list[Plan], demands, hours, reservation_ids, now) -> None:
    """The cycle placed its queue with the held nodes closed. Here the waiting work gets them where it is over
    before every window held there starts (backfill), and due reservations get reservations' nodes in any case
    (never a node in maintenance); what would still run at a held start keeps waiting, with a reason naming the
    reservation or the maintenance and when. Changes `result` in place. Slices of MIG-capable models are left to the
    next cycle (their geometry is the MIG engine's)."""
    held: dict[str, list[Plan]] = {}
    for plan in sorted(plans, key=lambda plan: plan.start):
        for node in plan.nodes:
            held.setdefault(node, []).append(plan)
    if not held:
        return
    probe = engine.start.fork()
    probe.hold(_allocation(binding) for binding in result.bindings)
    for node in (probe.node_index.keys() - held.keys()) | (set(engine.closed) - held.keys()):
        probe.close_node(node)
    waiting = {pending.demand_id: pending for pending in result.pending}
    for demand in demands:
        pending = waiting.get(demand.id)
        if pending is None or pending.reason not in _MAY_BACKFILL or engine.is_mig(demand):
            continue
        placed = probe.place_one(demand)
        if isinstance(placed, Pending):
            continue
        ends = now + timedelta(hours=hours[demand.id])
        blocking = [
            (plan, binding.node)
            for binding in placed
            for plan in held[binding.node]
            if plan.start < ends and not (demand.id in reservation_ids and plan.request_id is not None)
        ]
        if not blocking:
            result.bindings.extend(placed)
            result.pending.remove(pending)
            continue
        for binding in placed:
            probe.release(binding)
        plan, node = min(blocking, key=lambda pair: pair[0].start)
        result.pending[result.pending.index(pending)] = _kept_off(pending, plan, node, now)


def _kept_off(pending: Pending, plan: Plan, node: str, now: datetime) -> Pending:
    numbers = {"node": node, "reserved_from": plan.start.isoformat(), "until": plan.end.isoformat()}
    if plan.request_id is None:
        return Pending(
            pending.demand_id,
            MAINTENANCE,
            (
                f"{node} is in maintenance until {said(plan.end)} ({plan.maintenance})"
                if plan.start <= now
                else f"it would still run on {node} when its maintenance starts ({said(plan.start)}, until "
                f"{said(plan.end)}: {plan.maintenance})"
            )
            + "; it waits for a node that is free for its whole term",
            numbers,
        )
    return Pending(
        pending.demand_id,
        RESERVATION_AHEAD,
        f"it would still run on {node} when reservation #{plan.request_id} starts there ({said(plan.start)}); "
        "it waits for a node that is free for its whole term",
        {**numbers, "reservation": plan.request_id},
    )


def _binding(allocation: RunningAllocation) -> Binding:
    return Binding(allocation.id, allocation.node, allocation.devices, allocation.cpu_milli, allocation.memory_mib)


def _allocation(binding: Binding) -> RunningAllocation:
    return RunningAllocation(binding.demand_id, binding.node, binding.devices, binding.cpu_milli, binding.memory_mib)
