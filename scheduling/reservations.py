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

RESERVATION_NOT_DUE = "reservation_not_due"  # the queue reason of a reservation before its window
# The queue reason of work kept off a planned node: it would still run there when the reservation starts.
RESERVATION_AHEAD = "reservation_ahead"
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
        reason = reasons[plan.request_id]
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


# -- holding: planned nodes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The nodes a reservation not begun will run on, worked out again each cycle; whole nodes (what a Slurm
    reservation holds)."""

    request_id: int
    start: datetime
    end: datetime
    held: tuple[RunningAllocation, ...]  # its placement at its start; empty: no node is free for it then

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(allocation.node for allocation in self.held)


def plan_nodes(*, start_engine, running, expires, not_due_requests, closed, demand_of) -> list[Plan]:
    """Each reservation not begun (the first MAX_PLANNED by start), placed at its start on the cycle's start state
    (`start_engine`, frozen; forked here) with the running work that has ended by then given back and the plans
    before it that overlap its window held. `closed`: nodes no work goes to (a backend that does not answer)."""
    plans: list[Plan] = []
    for request in sorted(not_due_requests, key=lambda request: request.reserved_start)[:MAX_PLANNED]:
        start = request.reserved_start
        end = start + timedelta(hours=request.duration_hours)
        probe = start_engine.fork()
        for name in closed:
            probe.close_node(name)
        for allocation in running:
            ends = expires.get(allocation.id)
            if ends is not None and ends <= start:
                probe.release(_binding(allocation))
        probe.hold(allocation for plan in plans if plan.start < end and plan.end > start for allocation in plan.held)
        placed = probe.place_one(demand_of(request))
        held = () if isinstance(placed, Pending) else tuple(_allocation(binding) for binding in placed)
        plans.append(Plan(request.pk, start, end, held))
    return plans


def backfill_planned(*, engine, result, plans: list[Plan], demands, hours, reservation_ids, now) -> None:
    """The cycle placed its queue with the planned nodes closed. Here the waiting work gets them where it is over
    before every reservation planned there starts (backfill), and reservations that are due get them in any case;
    what would still run at a planned start keeps waiting, with a reason naming the reservation and when. Changes
    `result` in place. Slices of MIG-capable models are left to the next cycle (their geometry is the MIG engine's)."""
    planned = {node: plan for plan in sorted(plans, key=lambda plan: plan.start) for node in plan.nodes}
    if not planned:
        return
    probe = engine.start.fork()
    probe.hold(_allocation(binding) for binding in result.bindings)
    for node in probe.node_index.keys() - planned.keys():
        probe.close_node(node)
    for name in engine.closed:
        if name not in planned:
            probe.close_node(name)
    waiting = {pending.demand_id: pending for pending in result.pending}
    for demand in demands:
        pending = waiting.get(demand.id)
        if pending is None or pending.reason not in _MAY_BACKFILL or engine.is_mig(demand):
            continue
        placed = probe.place_one(demand)
        if isinstance(placed, Pending):
            continue
        ends = now + timedelta(hours=hours[demand.id])
        first = min((planned[binding.node] for binding in placed), key=lambda plan: plan.start)
        if demand.id in reservation_ids or ends <= first.start:
            result.bindings.extend(placed)
            result.pending.remove(pending)
            continue
        for binding in placed:
            probe.release(binding)
        result.pending[result.pending.index(pending)] = _kept_off(pending, first, placed[0].node)


def _kept_off(pending: Pending, plan: Plan, node: str) -> Pending:
    return Pending(
        pending.demand_id,
        RESERVATION_AHEAD,
        f"it would still run on {node} when reservation #{plan.request_id} starts there ({said(plan.start)}); "
        "it waits for a node that is free for its whole term",
        {"reservation": plan.request_id, "node": node, "reserved_from": plan.start.isoformat()},
    )


def _binding(allocation: RunningAllocation) -> Binding:
    return Binding(allocation.id, allocation.node, allocation.devices, allocation.cpu_milli, allocation.memory_mib)


def _allocation(binding: Binding) -> RunningAllocation:
    return RunningAllocation(binding.demand_id, binding.node, binding.devices, binding.cpu_milli, binding.memory_mib)
