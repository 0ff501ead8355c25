"""Reservation for the head of the queue (EASY backfilling).

When the first request in queue order is crowded out, the cycle works out where and when it could start: on the
current allocations' expiry times, releasing them earliest first until it fits. Requests behind it may still
start now, but not on that node if they would still be running at that time: they wait with
`higher_priority_ahead`, so large requests are not starved by a stream of small ones. A multi-node gang at the head
holds every node it would take (its members' nodes, inside its domain), so work that would outlast the reservation
stays off all of them.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduling.engine import (
    CAPACITY_IN_USE,
    FRAGMENTATION,
    HIGHER_PRIORITY_AHEAD,
    TOPOLOGY_CONSTRAINT,
    Binding,
    Pending,
    RunningAllocation,
)

CROWDED_OUT = {CAPACITY_IN_USE, FRAGMENTATION, TOPOLOGY_CONSTRAINT}
MAX_RELEASES = 2000  # how far ahead the reservation looks, in released allocations


@dataclass(frozen=True)
class Reservation:
    request_id: str
    node: str  # the first of `nodes`
    start: datetime
    nodes: tuple[str, ...] = ()  # every node held: a gang's members' nodes; empty: `node` alone

    @property
    def held(self) -> tuple[str, ...]:
        return self.nodes or (self.node,)


def reserve_for_head(
    *, engine, allocations, expires: dict[str, datetime], result, demands, hours, now
) -> Reservation | None:
    """Where and from when the first crowded-out request could run, given everything ahead of it. `engine` is the
    cycle's (`at_start(running)`: an engine at the cycle's start state plus `running`), `allocations` what ran
    when the cycle started."""
    reasons = {pending.demand_id: pending.reason for pending in result.pending}
    head_at = next((i for i, demand in enumerate(demands) if reasons.get(demand.id) in CROWDED_OUT), None)
    if head_at is None:
        return None
    head, ahead = demands[head_at], {demand.id for demand in demands[:head_at]}
    placed_ahead = [binding for binding in result.bindings if binding.demand_id in ahead]
    placed = [
        RunningAllocation(binding.demand_id, binding.node, binding.devices, binding.cpu_milli, binding.memory_mib)
        for binding in placed_ahead
    ]
    running = [*allocations, *placed]
    ends = {
        **expires,
        **{binding.demand_id: now + timedelta(hours=hours[binding.demand_id]) for binding in placed_ahead},
    }
    trial = engine.at_start(placed)
    for allocation in sorted(running, key=lambda allocation: ends[allocation.id])[:MAX_RELEASES]:
        trial.release(
            Binding(allocation.id, allocation.node, allocation.devices, allocation.cpu_milli, allocation.memory_mib)
        )
        outcome = trial.place_one(head)
        if not isinstance(outcome, Pending):
            nodes = tuple(dict.fromkeys(binding.node for binding in outcome)) if head.nodes > 1 else ()
            return Reservation(head.id, outcome[0].node, ends[allocation.id], nodes)
    return None


def hold_back_delaying(result, reservation: Reservation, demands, hours, now) -> None:
    """Turn the bindings that would delay the reservation into pending `higher_priority_ahead` (in place)."""
    position = {demand.id: i for i, demand in enumerate(demands)}
    head = position[reservation.request_id]
    delaying = [
        binding
        for binding in result.bindings
        if position[binding.demand_id] > head
        and binding.node in reservation.held
        and now + timedelta(hours=hours[binding.demand_id]) > reservation.start
    ]
    if not delaying:
        return
    held = {binding.demand_id for binding in delaying}  # all of a held demand's bindings: a gang's replicas too
    result.bindings = [binding for binding in result.bindings if binding.demand_id not in held]
    delaying = list({binding.demand_id: binding for binding in reversed(delaying)}.values())  # one reason each
    result.pending.extend(
        Pending(
            binding.demand_id,
            HIGHER_PRIORITY_AHEAD,
            f"would still be running on {binding.node} when request #{reservation.request_id} is due to start there "
            f"({reservation.start:%Y-%m-%d %H:%M} UTC); it waits so that larger request is not starved",
            {
                "reserved_for": reservation.request_id,
                "node": binding.node,
                "reserved_from": reservation.start.isoformat(),
            },
        )
        for binding in delaying
    )
