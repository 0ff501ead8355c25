"""Advance reservations in the queue (the order side is requests/reservations.py, the capacity side
scheduling/reservation_windows.py): a queued reservation whose window has not begun waits, with a reason that says
when it starts, and the cycle starts it at its start and not before. Its expected start is its start.

Holding: each cycle plans the nodes every reservation not begun will run on (`plan_nodes`: placed at its start with
the running work that has ended by then given back), closes them to its queue, then lets the waiting work onto them
only where it ends before the reservation starts (`backfill_planned`); work that would still run then waits with
`reservation_ahead`, naming the reservation and its start (and off a node in maintenance, `maintenance`: both codes
live with the forecast, which times them). Reservations are never preempted (their allocations are not
preemptible). A planned node that fails before the start is re-planned inside its topology domain, else the owner is
told (`replan_notes`)."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from requests.choices import EventCode
from requests.models import ResourceRequest
from scheduling.engine.backfill import CROWDED_OUT
from scheduling.engine.forecast import MAINTENANCE, RESERVATION_AHEAD, HeldWindow
from scheduling.engine.model import HEALTHY, INSUFFICIENT_HEALTHY_CAPACITY, Binding, Pending, RunningAllocation
from scheduling.models import MaintenanceWindow

RESERVATION_NOT_DUE = "reservation_not_due"  # the queue reason of a reservation before its window
# The expected start of a reservation no node is free for at its start, nor later before the horizon ends.
NO_WINDOW_IN_HORIZON = "no_window_in_horizon"
MAX_PLANNED = 100  # reservations a cycle plans nodes for, the soonest first
MAX_CANDIDATES = 200  # later starts tried for a reservation no node is free for at its start
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


def note_plans(reasons: dict[int, dict], plans: list["Plan"], previous: dict[int, dict]) -> None:
    """Each planned reservation's wait names the nodes planned for it (in place): what the calendar shows; and, once
    a planned node failed, which and why (`lost`, kept from the last cycle's wait in `previous` while the plan is not
    back on it) and, where no node is free at its start, when it is expected to start instead."""
    for plan in plans:
        reason = reasons[plan.request_id]  # reservations' plans only
        nodes = sorted(plan.nodes)
        before = previous.get(plan.request_id, {}).get("numbers", {}).get("lost", [])
        lost = [{"node": node, "reason": why} for node, why in plan.lost] or [
            failed for failed in before if failed["node"] not in plan.nodes
        ]
        numbers = {**reason["numbers"], "nodes": nodes}
        if lost:
            numbers["lost"] = lost
        if plan.expected != plan.start:
            numbers["expected_start"] = None if plan.expected is None else plan.expected.isoformat()
        reason["numbers"] = numbers
        reason["message"] = f"Reserved from {said(plan.start)}" + _where(plan, lost)


def _where(plan: "Plan", lost: list[dict]) -> str:
    failed = "; ".join(f"{failed['node']} failed: {failed['reason']}" for failed in lost)
    if plan.nodes:
        return f" on {', '.join(sorted(plan.nodes))}" + (f" ({failed})" if failed else "") + "; it starts then."
    return f"; {failed + '; ' if failed else ''}no node is free for it then: {_instead(plan.expected)}."


def _instead(expected: datetime | None) -> str:
    if expected is None:
        return "its start is unknown (no node is free for its window before the reservation horizon ends)"
    return f"expected to start {said(expected)} instead"


def not_due_estimates(reasons: dict[int, dict]) -> dict[int, dict]:
    """A reservation not begun is expected to start at its start, exactly; one no node is free for then, when it
    first fits (or no time)."""
    estimates = {}
    for pk, reason in reasons.items():
        if reason["code"] != RESERVATION_NOT_DUE:
            continue
        numbers = reason["numbers"]
        start = numbers.get("expected_start", numbers["start"])
        code = None if start is not None else NO_WINDOW_IN_HORIZON
        estimates[pk] = {"earliest": start, "likely": start, "latest": start, "code": code, "reason": None}
    return estimates


def replan_notes(plans: list["Plan"], previous: dict[int, dict]) -> list[tuple[int, str, str, dict]]:
    """What the owners of re-planned reservations are told, once per change: (request id, event code, sentence,
    data). A failed planned node re-planned inside its domain is a note on the timeline; one that was not (moved
    elsewhere, or no node free at the start) is told by mail too; a plan back on nodes after that is a note."""
    notes = []
    for plan in plans:
        data = {
            "lost": [{"node": node, "reason": why} for node, why in plan.lost],
            "nodes": sorted(plan.nodes),
            "start": plan.start.isoformat(),
            "expected_start": None if plan.expected is None else plan.expected.isoformat(),
        }
        if plan.lost:
            code = EventCode.RESERVATION_REPLANNED if plan.in_domain else EventCode.PLANNED_NODE_FAILED
            notes.append((plan.request_id, code, _failed_sentence(plan), {**data, "in_domain": plan.in_domain}))
        elif plan.nodes and "expected_start" in previous.get(plan.request_id, {}).get("numbers", {}):
            message = f"Planned again on {', '.join(sorted(plan.nodes))}: it starts as reserved, {said(plan.start)}."
            notes.append((plan.request_id, EventCode.RESERVATION_REPLANNED, message, data))
    return notes


def _failed_sentence(plan: "Plan") -> str:
    failed = "; ".join(f"{node} ({why})" for node, why in plan.lost)
    said_failed = f"Planned node{'s' if len(plan.lost) > 1 else ''} {failed} failed before the start"
    if plan.in_domain:
        return (
            f"{said_failed}: re-planned to {', '.join(sorted(plan.nodes))} in the same domain; it starts as reserved, "
            f"{said(plan.start)}."
        )
    if plan.nodes:
        return (
            f"{said_failed}, and no node of its domain is free for the window: re-planned to "
            f"{', '.join(sorted(plan.nodes))}; it starts as reserved, {said(plan.start)}."
        )
    return f"{said_failed}, and no node is free for the window: {_instead(plan.expected)}."


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
    # A reservation's: the nodes planned before that failed since, each with why, this cycle; whether its new nodes
    # are in their topology domain; and when it is expected to start (its start; later or None: no node then).
    lost: tuple[tuple[str, str], ...] = ()
    in_domain: bool = False
    expected: datetime | None = None

    def overlaps(self, start: datetime, end: datetime) -> bool:
        return self.start < end and self.end > start

    @property
    def held_window(self) -> HeldWindow:
        """The plan as the forecast holds it."""
        if self.request_id is None:
            return HeldWindow(self.start, self.end, self.nodes, MAINTENANCE, f"maintenance ({self.maintenance})")
        return HeldWindow(self.start, self.end, self.nodes, RESERVATION_AHEAD, f"reservation #{self.request_id}")


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


def plan_nodes(
    *, start_engine, running, expires, not_due_requests, closed, maintenance, demand_of, failures, domains, horizon
) -> list[Plan]:
    """Each reservation not begun (the first MAX_PLANNED by start), placed at its start on the cycle's start state
    (`start_engine`, frozen; forked here) with the running work that has ended by then given back, the plans before
    it that overlap its window held and the nodes of `maintenance` windows overlapping it closed. `closed`: nodes no
    work goes to (a backend that does not answer).

    A plan stays on the nodes the last cycle planned while it fits there. A node planned that has failed since
    (`lost`: cordoned, a card not healthy, gone, or in maintenance during the window) is re-planned inside its
    topology domain when a node there is free for the window; else the plan goes where it fits, or, where nothing is
    free at its start, says when it is expected to start instead (the first moment before `horizon` it fits, or
    None). For the nodes planned before that may have failed, `failures(names)` says why in words and
    `domains(names)` gives {node: domain} of every node sharing a domain with them: asked once for all reservations,
    only when there are such nodes."""
    ordered = sorted(not_due_requests, key=lambda request: request.reserved_start)[:MAX_PLANNED]
    before = {request.pk: planned_before(request) for request in ordered}
    in_maintenance = {node for plan in maintenance for node in plan.nodes}
    suspects = {n for nodes in before.values() for n in nodes if n in in_maintenance or _failing(start_engine, n)}
    words, domain = (failures(suspects), domains(suspects)) if suspects else ({}, {})
    plans: list[Plan] = []
    for request in ordered:
        window = _Window(request.reserved_start, request.reserved_start + timedelta(hours=request.duration_hours))
        at = _AtStart(start_engine, running, expires, closed, maintenance, plans)
        demand = demand_of(request)
        held = at.placed(demand, window)
        if before[request.pk] and {allocation.node for allocation in held} != before[request.pk]:
            held = at.placed(demand, window, only=before[request.pk]) or held  # a plan stays where it was
        left = before[request.pk] - {allocation.node for allocation in held}
        lost = _lost(start_engine, left & suspects, maintenance, window, words)
        in_domain = False
        if lost:
            domains_lost = {domain.get(node) for node in lost}
            near = {node for node, name in domain.items() if name in domains_lost} | before[request.pk]
            inside = at.placed(demand, window, only=near - lost.keys())
            in_domain = bool(inside)
            held = inside or held
        expected = window.start if held else at.first_fit(demand, window, horizon)
        plans.append(
            Plan(
                window.start,
                window.end,
                frozenset(allocation.node for allocation in held),
                request_id=request.pk,
                held=held,
                lost=tuple(sorted(lost.items())),
                in_domain=in_domain,
                expected=expected,
            )
        )
    return plans


def planned_before(request: ResourceRequest) -> frozenset[str]:
    """The nodes the last cycle planned for a reservation not begun (its wait names them)."""
    reason = request.queue_reason or {}
    if reason.get("code") != RESERVATION_NOT_DUE:
        return frozenset()
    return frozenset(reason.get("numbers", {}).get("nodes", ()))


@dataclass(frozen=True)
class _Window:
    start: datetime
    end: datetime


class _AtStart:
    """The cycle's start state as it will be at a window's start: the running work ended by then given back, the
    plans made before overlapping it held, the closed nodes and those in maintenance during it closed."""

    def __init__(self, start_engine, running, expires, closed, maintenance, plans):
        self.start_engine, self.running, self.expires = start_engine, running, expires
        self.closed, self.maintenance, self.plans = closed, maintenance, plans

    def probe(self, window: _Window):
        probe = self.start_engine.fork()
        shut = {
            *self.closed,
            *(n for plan in self.maintenance if plan.overlaps(window.start, window.end) for n in plan.nodes),
        }
        for name in shut:
            probe.close_node(name)
        for allocation in self.running:
            ends = self.expires.get(allocation.id)
            if ends is not None and ends <= window.start:
                probe.release(_binding(allocation))
        probe.hold(a for plan in self.plans if plan.overlaps(window.start, window.end) for a in plan.held)
        return probe

    def placed(self, demand, window: _Window, only: set[str] | None = None) -> tuple[RunningAllocation, ...]:
        """Where the demand goes for the window (on the nodes `only`, when given); empty: nowhere."""
        probe = self.probe(window)
        if only is not None:
            for name in probe.node_index.keys() - only:
                probe.close_node(name)
        placed = probe.place_one(demand)
        return () if isinstance(placed, Pending) else tuple(_allocation(binding) for binding in placed)

    def first_fit(self, demand, window: _Window, horizon: datetime) -> datetime | None:
        """The first moment after the window's start, before `horizon`, at which a window as long fits: a moment
        running work, a maintenance window or a plan ends (MAX_CANDIDATES of them at most); None: none."""
        length = window.end - window.start
        ends = {self.expires.get(allocation.id) for allocation in self.running}
        ends |= {plan.end for plan in [*self.maintenance, *self.plans]}
        later = sorted(m for m in ends if m is not None and window.start < m and m + length <= horizon)
        for moment in later[:MAX_CANDIDATES]:
            if self.placed(demand, _Window(moment, moment + length)):
                return moment
        return None


def _failing(start_engine, name: str) -> bool:
    """The node is gone, cordoned, or has a card that is not healthy."""
    i = start_engine.node_index.get(name)
    if i is None:
        return True
    node = start_engine.nodes[i]
    return not node.schedulable or any(device.health != HEALTHY for device in node.devices)


def _lost(start_engine, suspects: frozenset[str], maintenance, window: _Window, words: dict) -> dict[str, str]:
    """{node: why} of these nodes planned before, left now, that are in maintenance during the window or failing."""
    lost: dict[str, str] = {}
    for name in sorted(suspects):
        busy = next((p for p in maintenance if name in p.nodes and p.overlaps(window.start, window.end)), None)
        if busy is not None:
            lost[name] = f"in maintenance from {said(busy.start)} until {said(busy.end)} ({busy.maintenance})"
        elif _failing(start_engine, name):
            lost[name] = words.get(name, "removed from the inventory")
    return lost


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
