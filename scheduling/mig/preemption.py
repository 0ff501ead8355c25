"""Victims for a MIG demand that finds no valid placement: the smallest set of running work on one node whose
release leaves a valid placement of the profile (the freed memory slices must hold one of its placements, or an
emptied card may change mode), with the CPU and memory the demand needs. Pure Python."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduling.engine import smallest_victim_set
from scheduling.mig.model import Holding, MigPreemptionPlan, SliceDemand


def plan(engine, demand: SliceDemand, candidates: Iterable[Holding], budget: int = 200_000) -> MigPreemptionPlan:
    """Among the candidates (running work the caller may evict for this demand) on a `MigEngine`, the fewest
    victims, then the lowest priorities, then the youngest (`scheduling.engine.smallest_victim_set`)."""
    if engine.fits(demand):
        return MigPreemptionPlan(True, message="fits without preemption")
    by_node: dict[int, list[Holding]] = {}
    for holding in candidates:
        by_node.setdefault(engine.node_index[holding.node], []).append(holding)
    best = smallest_victim_set(by_node, lambda i, subset: fits_without(engine, i, subset, demand), budget)
    if best is None:
        return MigPreemptionPlan(
            False, message=f"needs {demand.label}; no set of preemptible work frees a valid placement on one node"
        )
    _key, i, subset = best
    ids = tuple(h.id for h in subset)
    name = engine.nodes[i].name
    return MigPreemptionPlan(True, name, ids, f"evict {len(ids)} allocation(s) on {name}: {', '.join(ids)}")


def fits_without(engine, i: int, subset: Sequence[Holding], demand: SliceDemand) -> bool:
    """Whether the demand has a valid placement on node ``i`` once the subset is released (nothing changes)."""
    if not engine.nodes[i].schedulable or not demand.needs <= engine.nodes[i].capabilities:
        return False
    cpu = engine.cpu[i] + sum(h.cpu_milli for h in subset)
    mem = engine.mem[i] + sum(h.memory_mib for h in subset)
    return engine.fits_state(cpu, mem, engine.released_cards(i, subset), demand)
