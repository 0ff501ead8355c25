"""Preemption planning for a multi-node gang: the cheapest set of victims inside ONE domain whose eviction lets the
whole gang fit there.

The victims are the one-node planner's (running, strictly lower priority, allowed by the caller's `evictable`); a
victim is a request, so evicting it frees every node it runs on. Per domain of the gang's level (of one backend, as
gang.py's domains are) the gang lacks the members its free nodes cannot take; the planner frees that many more of
the domain's nodes, one at a time, each time the node whose own cheapest set of further victims (`smallest_victim_set`,
exhaustive on that node) is cheapest, counting what the victims chosen so far already free. The domain whose victims
together are cheapest (`victim_key`: fewest, then lowest priorities, then youngest) wins; victims never come from
two domains, so a `required` gang never preempts across racks. A `preferred` gang is planned at its level first and
at the next one only when no domain of its level can be freed enough (its fewest domains). No domain that can be
freed: not feasible, and the message says how close the best one comes. Reads the engine's state, never changes it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from scheduling.engine.gang import (
    LEVELS,
    PREFERRED,
    REQUIRED,
    could_hold,
    domain_name,
    holds_member_without,
)
from scheduling.engine.model import Demand, RunningAllocation
from scheduling.engine.preemption import PreemptionPlan, smallest_victim_set, victim_key

NOTHING = victim_key(())  # the cost of a node that frees with the victims chosen already


class GangPreemption:
    """Plans one gang's victims on one engine (`PlacementEngine.plan_preemption` for a demand with ``nodes`` > 1)."""

    def __init__(self, engine, demand: Demand, evictable: Callable[[RunningAllocation], bool], budget: int):
        self.engine, self.demand, self.left = engine, demand, budget
        self.index = engine.gangs.index(demand)
        # node position -> victim id -> its allocations on that node; only nodes that cannot take a member now
        # but could once emptied (schedulable, offering what the gang needs, big enough)
        self.victims: dict[int, dict[str, list[RunningAllocation]]] = defaultdict(lambda: defaultdict(list))
        self.one_of: dict[str, RunningAllocation] = {}  # victim id -> one of its allocations (for victim_key)
        able, roomy = engine.able(demand.needs), {}
        for allocation in engine.allocations:
            if allocation.priority >= demand.priority or not evictable(allocation):
                continue
            i = engine.node_index[allocation.node]
            if i not in roomy:
                node = engine.nodes[i]
                roomy[i] = (
                    self.index.spare[i] is None
                    and node.schedulable
                    and (able is None or i in able)
                    and could_hold(node, demand)
                )
            if roomy[i]:
                self.victims[i][allocation.id].append(allocation)
                self.one_of.setdefault(allocation.id, allocation)

    def plan(self) -> PreemptionPlan:
        demand = self.demand
        levels = LEVELS[LEVELS.index(demand.level) :] if demand.mode == PREFERRED else (demand.level,)
        closest = (0, "")  # minus the most nodes one domain of the last level tried could offer, and which
        for level in levels:
            best, closest = self._cheapest_domain(level)
            if best is not None:
                return self._feasible(level, *best)
        return self._infeasible(levels[-1], -closest[0], closest[1])

    def _cheapest_domain(self, level: str):
        """((cost, path, victim ids, freed nodes) of the cheapest domain of `level`, or None; (minus the most nodes
        a domain could offer after evicting all its victims, that domain: the first by name of those that offer as
        many))."""
        demand, free = self.demand, self.index.members[level]
        paths = self.engine.topology.paths
        by_domain: dict[str, list[int]] = defaultdict(list)
        for i in self.victims:
            if holds_member_without(self.engine, i, demand, _all(self.victims[i])):
                by_domain[paths[i][level]].append(i)  # evicting all its victims frees it: worth searching
        best, closest = None, min(((-len(nodes), path) for path, nodes in free.items()), default=(0, ""))
        for path, nodes in sorted(by_domain.items()):
            have = len(free.get(path, ()))
            closest = min(closest, (-(have + len(nodes)), path))
            if have + len(nodes) < demand.nodes:
                continue
            chosen = self._free_nodes(nodes, demand.nodes - have)
            if chosen is None:  # out of budget
                continue
            ids, freed = chosen
            cost = victim_key([self.one_of[victim] for victim in ids])
            if best is None or (cost, path) < best[:2]:
                best = (cost, path, ids, freed)
        return best, closest

    def _free_nodes(self, nodes: list[int], lacking: int) -> tuple[set[str], list[int]] | None:
        """Victims that free `lacking` of these nodes, chosen a node at a time, the cheapest further set first
        (None when the search ran out of budget)."""
        evicted: set[str] = set()
        freed: list[int] = []
        cheapest: dict[int, tuple | None] = {}  # node -> (its cost, its further victims) given `evicted`
        rank = self.engine.rank
        remaining = set(nodes)
        while len(freed) < lacking:
            for i in remaining - cheapest.keys():
                cheapest[i] = self._cheapest_on(i, evicted)
            options = [(cheapest[i][0], rank[i], i) for i in remaining if cheapest[i] is not None]
            if not options:
                return None
            _cost, _rank, i = min(options)
            more = cheapest[i][1]
            evicted |= more
            freed.append(i)
            remaining.discard(i)
            for j in remaining:  # the new victims free room on the other nodes they run on too
                if more & self.victims[j].keys():
                    cheapest.pop(j, None)
        return evicted, freed

    def _cheapest_on(self, i: int, evicted: set[str]) -> tuple | None:
        """(cost, victim ids) of the cheapest further victims on node i for it to take a member, the `evicted` ones
        gone already; None when the budget ran out first."""
        on_node = self.victims[i]
        gone = _all({victim: on_node[victim] for victim in on_node.keys() & evicted})
        if holds_member_without(self.engine, i, self.demand, gone):
            return NOTHING, frozenset()
        others = [self.one_of[victim] for victim in on_node if victim not in evicted]

        def frees(_i: int, subset) -> bool:
            self.left -= 1
            more = [allocation for victim in subset for allocation in on_node[victim.id]]
            return self.left >= 0 and holds_member_without(self.engine, i, self.demand, gone + more)

        found = smallest_victim_set({i: others}, frees, max(self.left, 0))
        return None if found is None else (found[0], frozenset(victim.id for victim in found[2]))

    def _feasible(self, level: str, _cost, path: str, ids: set[str], freed: list[int]) -> PreemptionPlan:
        demand, nodes = self.demand, self.engine.nodes
        victims = tuple(sorted(ids))
        names = tuple(nodes[i].name for i in sorted(freed, key=lambda i: nodes[i].name))
        domain = domain_name(path)
        return PreemptionPlan(
            True,
            victims=victims,
            message=f"evict {len(victims)} allocation(s) in {level} {domain} to free {', '.join(names)} for "
            f"{demand.label}: {', '.join(victims)}",
            domain=domain,
            level=level,
            nodes=names,
        )

    def _infeasible(self, level: str, most: int, path: str) -> PreemptionPlan:
        demand = self.demand
        where = f"no {level}" if demand.mode == REQUIRED else "no domain"
        best = f"; the best, {domain_name(path)}, could offer {most}" if path else ""
        return PreemptionPlan(
            False,
            message=f"{where} could hold all {demand.nodes} nodes even after preempting every lower-priority "
            f"allocation it may evict{best}",
            domain=domain_name(path) if path else "",
            level=level,
            reachable=most,
        )


def _all(victims: dict[str, list[RunningAllocation]]) -> list[RunningAllocation]:
    """The allocations of these victims (on one node)."""
    return [allocation for allocations in victims.values() for allocation in allocations]


def plan_gang(
    engine, demand: Demand, evictable: Callable[[RunningAllocation], bool], budget: int = 200_000
) -> PreemptionPlan:
    """See the module's docstring; ``evictable`` says which running allocations the caller's rules let go."""
    if engine.fits(demand):
        return PreemptionPlan(True, message="fits without preemption")
    return GangPreemption(engine, demand, evictable, budget).plan()
