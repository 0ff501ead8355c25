"""Preemption planning: the smallest set of running, preemptible, lower-priority work whose eviction lets a demand
fit. A `PreemptionPlanner` evicts and puts back on its engine's state, and leaves it as it was."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import combinations

from scheduling.engine.model import Demand, DemandShape, RunningAllocation


@dataclass(frozen=True)
class PreemptionPlan:
    """Whom to evict, and where, for a demand to fit (``feasible`` False: no set of victims would do). A one-node
    demand's victims are on ``node``; a multi-node gang's (gang_preemption.py) inside one ``domain`` of ``level``,
    freeing ``nodes`` for its members; a gang no domain can be freed enough for names the one that comes closest and
    the nodes it could offer (``reachable``)."""

    feasible: bool
    node: str | None = None
    victims: tuple[str, ...] = ()
    message: str = ""
    domain: str = ""
    level: str = ""
    nodes: tuple[str, ...] = ()
    reachable: int = 0

    @property
    def where(self) -> str:
        """Where the victims are, in words: "on a1", or "in rack r2 (freeing r2-n0, r2-n1)"."""
        if not self.domain:
            return f"on {self.node}"
        return f"in {self.level} {self.domain} (freeing {', '.join(self.nodes)})"

    @property
    def numbers(self) -> dict:
        """Where the victims are, as numbers: {"node"}, or a gang's {"level", "domain", "nodes"}."""
        if not self.domain:
            return {"node": self.node}
        return {"level": self.level, "domain": self.domain, "nodes": list(self.nodes)}


class PreemptionPlanner:
    """Plans victims on one engine (`PlacementEngine.plan_preemption`). ``engine`` is that `PlacementEngine`
    (place.py), not imported here: place.py imports this module."""

    def __init__(self, engine):
        self.engine = engine

    def plan(
        self,
        demand: Demand,
        max_combinations: int = 200_000,
        evictable: Callable[[RunningAllocation], bool] | None = None,
    ) -> PreemptionPlan:
        """See `PlacementEngine.plan_preemption`."""
        engine = self.engine
        if engine.fits(demand):
            return PreemptionPlan(True, message="fits without preemption")
        if demand.replicas > 1:
            return PreemptionPlan(
                False, message=f"needs {demand.label}; preemption is not planned for replicated demands"
            )
        shape = DemandShape(demand)
        may_evict = evictable or (lambda allocation: allocation.preemptible)
        by_node: dict[int, list[RunningAllocation]] = {}
        able = engine.able(demand.needs)
        for allocation in engine.allocations:
            i = engine.node_index[allocation.node]
            if allocation.priority < demand.priority and may_evict(allocation) and (able is None or i in able):
                by_node.setdefault(i, []).append(allocation)
        best = smallest_victim_set(by_node, lambda i, subset: self._fits_without(i, subset, shape), max_combinations)
        if best is None:
            return PreemptionPlan(
                False,
                message=f"needs {demand.label}; no set of preemptible lower-priority "
                f"allocations frees enough room on one node",
            )
        _key, i, subset = best
        ids = tuple(a.id for a in subset)
        return PreemptionPlan(
            True,
            engine.nodes[i].name,
            ids,
            f"evict {len(ids)} allocation(s) on {engine.nodes[i].name}: {', '.join(ids)}",
        )

    def _fits_without(self, i: int, subset, shape: DemandShape) -> bool:
        engine = self.engine
        for a in subset:
            engine._apply(i, a.devices, a.cpu_milli, a.memory_mib, sign=+1, refresh=False)
        try:
            return engine._evaluate(engine._state(i), shape, engine.nodes[i]) is not None
        finally:
            for a in subset:
                engine._apply(i, a.devices, a.cpu_milli, a.memory_mib, refresh=False)


def smallest_victim_set(by_node: Mapping[int, list], fits_without, budget: int = 200_000):
    """(key, node, victims) of the smallest set of victims on one node whose eviction lets a demand fit: fewest
    victims, then lowest priorities, then youngest (`victim_key`); None when no set does. ``by_node`` maps a node
    to its candidates (``priority``, ``started_at``, ``id``), ``fits_without(node, subset)`` says whether the
    demand fits once the subset is gone. Exhaustive per node by victim count, within ``budget`` subsets in all."""
    best = None
    for i, victims in sorted(by_node.items()):
        victims = sorted(victims, key=lambda a: (a.priority, -a.started_at, a.id))
        for size in range(1, len(victims) + 1):
            if best is not None and size > best[0][0]:
                break
            found = None
            for subset in combinations(victims, size):
                budget -= 1
                if budget < 0:
                    break
                key = victim_key(subset)
                if (best is not None and key >= best[0]) or (found is not None and key >= found[0]):
                    continue
                if fits_without(i, subset):
                    found = (key, i, subset)
            if found is not None:
                if best is None or found[0] < best[0]:
                    best = found
                break
    return best


def victim_key(subset) -> tuple:
    priorities = sorted((a.priority for a in subset), reverse=True)
    return (len(subset), priorities, -sum(a.started_at for a in subset), tuple(sorted(a.id for a in subset)))
