"""Placing: heterogeneous, health- and topology-aware GPU/NPU placement over an in-memory snapshot.

Pure Python, no Django: the scheduler service loads a `Snapshot`, calls `PlacementEngine(snapshot).place(demands)`
and commits the returned bindings. Units are integers: milli-CPU, MiB, and milli-device shares (1000 = one card).
`PlacementEngine` keeps the cluster's state and places on it; which node is best for a shape is its scoring half
(`ShapeScores`, scoring.py); it asks its `Explainer` (explain.py) why a demand waits, its `NeverFits`
(never_fits.py) whether one can never run on the inventory, and a `PreemptionPlanner` (preemption.py) whom to evict.

Policies live in `scheduling.engine.policies`: ``fgd`` (Fragmentation Gradient Descent as in the FGD paper's simulator),
``bestfit`` and ``random`` baselines, ``fgd-pack`` (experimental) and ``fgd-plus``, the production ``default``: FGD
behind a model-pressure key that keeps contested models for the demands restricted to them.
Ties between equally scored nodes go to a fixed node order drawn from the engine's seed.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from scheduling.engine.explain import Explainer
from scheduling.engine.frag import FragTable
from scheduling.engine.gang import GangPlacer, Topology
from scheduling.engine.gang_preemption import plan_gang
from scheduling.engine.model import (
    HEALTHY,
    HIGHER_PRIORITY_AHEAD,
    ISOLATED,
    NO_MATCHING_SPEC,
    REPLICAS_SHARE_NODE,
    Binding,
    Demand,
    DemandShape,
    Pending,
    PlacementResult,
    RunningAllocation,
    Snapshot,
)
from scheduling.engine.never_fits import NeverFits
from scheduling.engine.policies import Policy, RandomPolicy, make_policy
from scheduling.engine.preemption import PreemptionPlan, PreemptionPlanner
from scheduling.engine.scoring import ShapeScores, one_slice_table_per_model


class PlacementEngine(ShapeScores):
    """Mutable cluster state plus a policy. ``place`` binds demands in order and explains the rest.

    ``fork`` gives a copy to try placements on: building the state scores every node in Python, a fork copies a few
    flat lists (no per-node work) and then costs what is placed on it, and the engine it came from stays as it was
    (it is frozen: placing on it afterwards is an error)."""

    def __init__(
        self,
        snapshot: Snapshot,
        policy: str | Policy = "default",
        seed: int = 0,
        workload: Iterable[Demand] | None = None,
    ):
        self._origin: PlacementEngine | None = None  # the frozen engine whose shape indexes a fork copies
        self._origin_generation = 0
        self.generation = 0  # how many times `advance` moved this engine on (its forks know the one they came from)
        self._frozen = False
        self._index_lock = threading.Lock()
        self.nodes = list(snapshot.nodes)
        self.node_index = {node.name: i for i, node in enumerate(self.nodes)}
        order = list(range(len(self.nodes)))
        random.Random(seed).shuffle(order)
        self.rank = [0] * len(self.nodes)
        for position, i in enumerate(order):
            self.rank[i] = position
        self.rng = random.Random(seed + 1_000_003)
        self.cpu = [node.cpu_milli for node in self.nodes]
        self.mem = [node.memory_mib for node in self.nodes]
        self.free = [
            [device.capacity if device.health != ISOLATED else 0 for device in node.devices] for node in self.nodes
        ]
        self.allocations: list[RunningAllocation] = []  # ids repeat: a replicated request's replicas share its id
        for allocation in snapshot.allocations:
            self._apply(
                self.node_index[allocation.node],
                allocation.devices,
                allocation.cpu_milli,
                allocation.memory_mib,
                refresh=False,
            )
            self.allocations.append(allocation)
        self.policy = policy if isinstance(policy, Policy) else self._learn(policy, workload)
        self.is_random = isinstance(self.policy, RandomPolicy)
        self.version = [0] * len(self.nodes)
        self.changed: list[int] = []
        self.state = [self._state(i) for i in range(len(self.nodes))]
        # Each distinct device tuple gets a small integer once, so the per-shape score memos hash a few ints per
        # node visit instead of the nested tuple (shared with forks: a pure cache, ids are never reused).
        self._dsids: dict = {}
        self._dsid_counter = itertools.count()
        self.dsid = [self._dsid(state[2]) for state in self.state]
        self._indexes: dict = {}
        self._gpu_memo: dict = {}
        self._takes: dict = {}  # (count, share, models) -> {device tuple id: its ways to take them} (a pure cache)
        self.never_fit = NeverFits(self.nodes)  # shared with forks: it depends on the inventory alone
        self.explainer = Explainer(self)
        self._slices_by_model = one_slice_table_per_model(self.nodes)
        self._able: dict[frozenset, frozenset[int]] = {}  # needs -> the nodes offering them (a pure cache)
        self._alike_cache: dict = {}  # since -> the nodes changed since then, grouped (`_alike`)
        self._alike_at = (0, 0)  # the change list length and generation the groupings were made at (the state)
        self._build_aggregates()
        self.policy.attach(self.model_healthy)
        self._topology: Topology | None = None  # the nodes' domains, worked out when a gang first asks
        self._gangs: GangPlacer | None = None

    def fork(self, *, workload: Iterable[Demand] | None = None, policy: str = "default") -> PlacementEngine:
        """A copy of the current state to place on, leaving this engine as it is; this engine is frozen from now on.

        Per-node lists are shared until the copy writes (``_apply`` replaces a node's free list, never edits it),
        and so are the caches that depend only on the inventory. With ``workload`` the copy gets a policy learnt
        from it, as the constructor would make it; without, it keeps this engine's policy and copies the scores
        this engine has for a demand shape, worked out once, instead of scoring every node again."""
        self._frozen = True
        forked = object.__new__(PlacementEngine)
        forked.__dict__.update(self.__dict__)
        forked.nodes, forked.cpu, forked.mem = list(self.nodes), list(self.cpu), list(self.mem)
        forked.free, forked.version, forked.changed = list(self.free), list(self.version), list(self.changed)
        forked.state, forked.dsid = list(self.state), list(self.dsid)
        forked.model_devices, forked.model_healthy = dict(self.model_devices), dict(self.model_healthy)
        forked.model_hist = {model: dict(hist) for model, hist in self.model_hist.items()}
        forked.rng = random.Random()
        forked.rng.setstate(self.rng.getstate())
        forked._indexes, forked._frozen, forked._index_lock = {}, False, threading.Lock()
        forked.explainer = self.explainer.for_fork(forked)  # per-node counts the fork's placements would change
        forked._alike_cache = {}  # the fork's own changes group differently
        forked._gangs = None  # its gang indexes follow the fork's own state
        forked._origin, forked._origin_generation = self, self.generation
        if workload is not None:
            forked.policy = make_policy(policy, workload_source(workload))
            forked.is_random = isinstance(forked.policy, RandomPolicy)
            forked.policy.attach(forked.model_healthy)
            forked._origin = None  # another policy scores nodes differently: no scores to copy
        return forked

    def _learn(self, policy: str, workload: Iterable[Demand] | None) -> Policy:
        source = workload_source(workload or ())
        if not source:  # no workload given: what is running now stands for recent demand
            source = [
                (a.cpu_milli, a.memory_mib, len(a.devices), a.devices[0][1] if a.devices else 0, frozenset())
                for a in self.allocations
            ]
        return make_policy(policy, source)

    def relearn(self, workload: Iterable[Demand] | None, policy: str = "default") -> None:
        """Score by a policy learnt afresh from `workload`, as an engine built over the same snapshot with that
        workload would. The state stays, and so does all that does not depend on the policy (device tuple ids, each
        shape's ways to take devices per device tuple, the inventory's rooms, the topology blocks): only the shape
        indexes are scored again, when next used. Like `advance`, earlier forks must not be used from here."""
        self._frozen = False
        self.generation += 1
        self.policy = self._learn(policy, workload)
        self.is_random = isinstance(self.policy, RandomPolicy)
        self.policy.attach(self.model_healthy)
        self._indexes = {}

    def advance(self, allocations: Sequence[RunningAllocation]) -> None:
        """Bring this engine to the same inventory and policy running `allocations` instead of what it holds: the
        work that ended is given back and the new work taken, so its shape indexes rescore only the nodes that
        changed (an engine built over the new snapshot scores every node for every shape again). Allowed on a
        frozen engine: its earlier forks must not be used from here (asking one for a shape it has not copied yet
        is an error)."""
        # What the state depends on, as plain tuples (hashed in C, unlike the dataclass): > 0 started, < 0 ended.
        change = Counter((a.node, a.devices, a.cpu_milli, a.memory_mib) for a in allocations)
        change.subtract((a.node, a.devices, a.cpu_milli, a.memory_mib) for a in self.allocations)
        self._frozen = False
        self.generation += 1
        for sign in (+1, -1):  # give back first: taking first could overdraw a node
            for (node, devices, cpu, mem), count in change.items():
                for _ in range(count * -sign):
                    self._apply(self.node_index[node], devices, cpu, mem, sign=sign)
        self.allocations = list(allocations)
        if len(self.changed) > 2 * len(self.nodes):
            self._compact_changes()

    def _compact_changes(self) -> None:
        """Start the change list afresh so it does not grow with the engine's life: indexes less than a fleet's
        worth of changes behind are brought up to date (what their next use would cost), the rest are dropped and
        built again when next used; so are the topology block counts (cheap, and only for pending reasons)."""
        behind = len(self.changed) - len(self.nodes)
        for key, index in list(self._indexes.items()):
            if index.seen is not None and index.seen >= behind:
                self._refresh(index, index.shape)
            else:
                del self._indexes[key]
        self.changed = []
        for index in self._indexes.values():
            index.seen = 0
        self.explainer.forget_blocks()
        if self._gangs is not None:
            self._gangs.forget()

    @property
    def topology(self) -> Topology:
        """Each node's rack, block and site domain (the inventory's: shared with forks)."""
        if self._topology is None:
            self._topology = Topology(self.nodes)
        return self._topology

    @property
    def gangs(self) -> GangPlacer:
        """The multi-node gang placer over this engine's state (gang.py)."""
        if self._gangs is None:
            self._gangs = GangPlacer(self)
        return self._gangs

    def close_node(self, name: str) -> None:
        """No new work on this node from now on (as if cordoned). The policy keeps what it learnt from the devices
        it saw, so the other nodes rank as before."""
        self._check_writable()
        i = self.node_index[name]
        if not self.nodes[i].schedulable:
            return
        self._count_node(i, -1)
        self.nodes[i] = replace(self.nodes[i], schedulable=False)
        self.version[i] += 1  # its entries in the shape indexes are stale now
        self.changed.append(i)

    def _check_writable(self):
        if self._frozen:  # its forks copied its scores and share its per-node lists
            raise RuntimeError("this engine was forked and is frozen: place on a fork")

    # -- state ------------------------------------------------------------------------------------------------

    def _state(self, i: int):
        node = self.nodes[i]
        free = self.free[i]
        devs = tuple(
            sorted((device.model, free[j]) for j, device in enumerate(node.devices) if device.health == HEALTHY)
        )
        return (self.cpu[i], self.mem[i], devs)

    def _dsid(self, devs: tuple) -> int:
        dsid = self._dsids.get(devs)
        if dsid is None:
            dsid = self._dsids.setdefault(devs, next(self._dsid_counter))
        return dsid

    def _apply(self, i: int, devices, cpu: int, mem: int, sign: int = -1, refresh: bool = True):
        self._check_writable()
        free = self.free[i] = list(self.free[i])  # a new list: a fork may share the old one
        for j, milli in devices:
            free[j] += sign * milli
        self.cpu[i] += sign * cpu
        self.mem[i] += sign * mem
        if refresh:
            self.version[i] += 1
            self.changed.append(i)
            self.state[i] = self._state(i)
            self.dsid[i] = self._dsid(self.state[i][2])
            self._aggregate_update(i, devices, sign)

    def _build_aggregates(self):
        """Per model: devices, healthy devices, and a histogram of healthy free milli (for pending reasons)."""
        self.model_devices: dict[str, int] = {}
        self.model_healthy: dict[str, int] = {}
        self.model_hist: dict[str, dict[int, int]] = {}
        for i, node in enumerate(self.nodes):
            if node.schedulable:
                self._count_node(i, +1)

    def _count_node(self, i: int, sign: int):
        """Add a schedulable node's devices to the aggregates (sign +1) or take them out (-1)."""
        free = self.free[i]
        for j, device in enumerate(self.nodes[i].devices):
            self.model_devices[device.model] = self.model_devices.get(device.model, 0) + sign
            if device.health == HEALTHY:
                self.model_healthy[device.model] = self.model_healthy.get(device.model, 0) + sign
                hist = self.model_hist.setdefault(device.model, {})
                hist[free[j]] = hist.get(free[j], 0) + sign

    def _aggregate_update(self, i: int, devices, sign: int):
        node = self.nodes[i]
        if not node.schedulable:
            return
        for j, milli in devices:
            device = node.devices[j]
            if device.health != HEALTHY:
                continue
            hist = self.model_hist[device.model]
            after = self.free[i][j]
            before = after - sign * milli
            hist[before] -= 1
            hist[after] = hist.get(after, 0) + 1

    def _choose_devices(self, i: int, picks, shape: DemandShape):
        node = self.nodes[i]
        free = self.free[i]
        used: set[int] = set()
        chosen = []
        for values in picks:
            for j, device in enumerate(node.devices):
                if j in used or device.health != HEALTHY or (device.model, free[j]) not in values:
                    continue
                used.add(j)
                chosen.append((j, self._share(shape, device.model, node)))
                break
            else:  # pragma: no cover - picks always come from this node's state
                raise RuntimeError(f"no device on {node.name} matches {values}")
        return tuple(sorted(chosen))

    # -- public API -------------------------------------------------------------------------------------------

    def place(self, demands: Sequence[Demand], backfill: bool = False) -> PlacementResult:
        """Bind demands in the given (priority) order (see `place_in_order`)."""
        return place_in_order(self, demands, backfill)

    def place_one(self, demand: Demand) -> list[Binding] | Pending:
        """Bind one demand now (every replica of a replicated one, every member of a multi-node gang), or say why it
        waits."""
        if demand.nodes > 1:
            return self.gangs.place(demand)
        if demand.replicas > 1:
            placed = self._bind_gang(demand)
            return placed if isinstance(placed, list) else self.explainer.gang(demand, placed)
        shape = DemandShape(demand)
        found = self._best_node(shape)
        if found is None:
            return self.diagnose(demand)
        return [self._bind(demand, shape, *found)]

    def _bind(self, demand: Demand, shape: DemandShape, i: int, picks, replica: int | None = None) -> Binding:
        devices = self._choose_devices(i, picks, shape)
        self._apply(i, devices, demand.cpu_milli, demand.memory_mib)
        return Binding(demand.id, self.nodes[i].name, devices, demand.cpu_milli, demand.memory_mib, replica)

    def _bind_gang(self, demand: Demand) -> list[Binding] | tuple[str, ...]:
        """Every replica bound, each on the best node among those holding the fewest of its replicas so far; or,
        when one does not fit, none (what was bound is given back) and the nodes the ones that fitted took."""
        shape = DemandShape(demand)
        held: dict[int, int] = {}  # node index -> replicas of this demand on it
        bindings = []
        for replica in range(demand.replicas):
            found = self._spread_node(shape, held)
            if found is None:
                for binding in bindings:
                    self.release(binding)
                return tuple(binding.node for binding in bindings)
            bindings.append(self._bind(demand, shape, *found, replica=replica))
            held[found[0]] = held.get(found[0], 0) + 1
        return bindings

    def _spread_node(self, shape: DemandShape, held: dict[int, int]):
        """The best node holding none of the gang's replicas; failing that (too few nodes have room) one holding
        the fewest, so that sharing stays even."""
        for level in sorted({0, *held.values()}):
            found = self._best_node(shape, {i for i, n in held.items() if n > level})
            if found is not None:
                return found
        return None

    def fits(self, demand: Demand) -> bool:
        if demand.nodes > 1:
            return self.gangs.fits(demand)
        if demand.replicas > 1:  # all the replicas: bound on trial, then given back
            placed = self._bind_gang(demand)
            if not isinstance(placed, list):
                return False
            for binding in placed:
                self.release(binding)
            return True
        return self._best_node(DemandShape(demand)) is not None

    def take(self, node: str, devices, cpu_milli: int, memory_mib: int) -> None:
        """What another engine bound on this node (the cycle's MIG engine): its CPU and memory, and all that is
        left of the devices it took (a card with a GPU instance takes no whole or shared work any more)."""
        i = self.node_index[node]
        free = self.free[i]
        self._apply(i, tuple((j, free[j]) for j in sorted(set(devices))), cpu_milli, memory_mib)

    def fits_now(self, demand: Demand, known: dict) -> bool:
        """`fits` for a demand held back behind a higher-priority one, where only yes or no matters (it picks the
        reason code): the first feasible node, unscored, instead of the shape's scored index over the whole fleet.
        Within one `place` nothing is freed, so a shape that fits nowhere stays so, and one that fits stays so while
        the node it fits on is unchanged. A replicated demand (or a multi-node one) is tried as the gang it is."""
        if demand.replicas > 1 or demand.nodes > 1:
            return self.fits(demand)
        shape = DemandShape(demand)
        if shape.key in known:
            seen = known[shape.key]
            if seen is None or self.version[seen[0]] == seen[1]:
                return seen is not None
        if self.is_random or shape.key in self._indexes:
            found = self._best_node(shape)
            i = None if found is None else found[0]
        else:
            i = next((i for i in range(len(self.nodes)) if self._feasible(i, shape)), None)
        known[shape.key] = None if i is None else (i, self.version[i])
        return i is not None

    def _feasible(self, i: int, shape: DemandShape) -> bool:
        node = self.nodes[i]
        cpu, mem, devs = self.state[i]
        return (
            node.schedulable
            and shape.needs <= node.capabilities
            and shape.cpu <= cpu
            and shape.mem <= mem
            and bool(self._gpu_options(devs, shape, node))
        )

    def able(self, needs: frozenset) -> frozenset[int] | None:
        """The positions of the nodes that offer `needs` (None when nothing is needed: every node). The nodes'
        capabilities do not change while the engine lives: worked out once per set of needs."""
        if not needs:
            return None
        able = self._able.get(needs)
        if able is None:
            able = self._able[needs] = frozenset(i for i, node in enumerate(self.nodes) if needs <= node.capabilities)
        return able

    def release(self, binding: Binding) -> None:
        """Give a binding's resources back (used by preemption planning and by simulations with departures)."""
        self._apply(self.node_index[binding.node], binding.devices, binding.cpu_milli, binding.memory_mib, sign=+1)

    def hold(self, allocations: Iterable[RunningAllocation]) -> None:
        """Add running work, as if the snapshot had held it: a fork of an engine made before placing, brought to
        what runs after, without another pass over the fleet (building an engine scores every node again)."""
        allocations = list(allocations)
        for held in allocations:
            self._apply(self.node_index[held.node], held.devices, held.cpu_milli, held.memory_mib)
        self.allocations = [*self.allocations, *allocations]  # a new list: a fork shares the one it came from

    # -- reasons ----------------------------------------------------------------------------------------------

    def diagnose(self, demand: Demand) -> Pending:
        """Why a demand cannot be placed now, with numbers (`Explainer.diagnose`; a multi-node gang's own reasons)."""
        if demand.nodes > 1:
            return self.gangs.explain(demand)
        return self.explainer.diagnose(demand)

    def never_fits(self, demand: Demand) -> Pending | None:
        """`unplaceable` over this engine's inventory (`NeverFits.check`; for a multi-node gang, its domains too)."""
        if demand.nodes > 1:
            return self.gangs.never_fits(demand)
        return self.never_fit.check(demand)

    # -- reporting --------------------------------------------------------------------------------------------

    def cluster_frag(self, table: FragTable | None = None) -> float:
        """Expected stranded device milli over all schedulable nodes."""
        table = table or self.policy.table
        return sum(table.frag(*self.state[i]) for i, node in enumerate(self.nodes) if node.schedulable)

    # -- preemption -------------------------------------------------------------------------------------------

    def plan_preemption(
        self,
        demand: Demand,
        max_combinations: int = 200_000,
        evictable: Callable[[RunningAllocation], bool] | None = None,
    ) -> PreemptionPlan:
        """Smallest set of running, preemptible, strictly lower-priority allocations whose eviction lets a one-node
        demand fit: fewest victims, then lowest priorities, then youngest. Exhaustive per node by victim count. A
        multi-node gang's victims are all inside one domain of its level (gang_preemption.py).
        ``evictable`` replaces the allocations' own preemptible flag (the caller's rules say who may evict whom), so
        one engine serves every class and tenant instead of one engine built per rule set. The state is left as it
        was: planning evicts and puts back. A replicated demand is not planned for (its replicas would need room on
        several nodes): it waits."""
        if demand.nodes > 1:
            return plan_gang(self, demand, evictable or (lambda allocation: allocation.preemptible), max_combinations)
        return PreemptionPlanner(self).plan(demand, max_combinations, evictable)


def spread_note(bindings: Sequence[Binding]) -> dict | None:
    """{code, message, numbers} when a replicated demand's replicas had to share a node (the engine shares only
    when no node holding fewer of them had room), else None. `bindings` are one demand's."""
    on_node: dict[str, list[int]] = {}
    for binding in bindings:
        on_node.setdefault(binding.node, []).append(binding.replica)
    shared = {node: sorted(replicas) for node, replicas in sorted(on_node.items()) if len(replicas) > 1}
    if not shared:
        return None
    worst = max(len(replicas) for replicas in shared.values())
    return {
        "code": REPLICAS_SHARE_NODE,
        "message": f"{len(bindings)} replicas on {len(on_node)} node{'s' if len(on_node) > 1 else ''}: no other "
        "node had room, so "
        + "; ".join(f"replicas {', '.join(map(str, replicas))} share {node}" for node, replicas in shared.items())
        + f". One node failing can take {worst} of the {len(bindings)} replicas down.",
        "numbers": {"replicas": len(bindings), "nodes": len(on_node), "shared": shared},
    }


def _overlap(a: frozenset, b: frozenset) -> bool:
    return not a or not b or bool(a & b)


def workload_source(demands: Iterable[Demand]) -> list[tuple[int, int, int, int, frozenset]]:
    """Demands as a policy learns its typical shapes from them. A multi-node gang counts as its members, each a node's
    worth: so the policy learns that whole free nodes are wanted, and keeps some whole rather than strand a card on
    each (the FGD idea applied to gangs)."""
    return [(d.cpu_milli, d.memory_mib, d.count, d.share, d.models) for d in demands for _ in range(d.nodes)]


def place_in_order(engine, demands: Sequence[Demand], backfill: bool = False) -> PlacementResult:
    """Bind demands in the given (priority) order on an engine with `fits_now` and `place_one` (this module's, or the
    cycle's pair of milli-share and MIG engines). Without ``backfill``, once a demand stays pending, lower-priority
    demands competing for the same models are held back (``higher_priority_ahead``)."""
    result = PlacementResult()
    blockers: dict[frozenset, Demand] = {}  # per model set: the highest-priority demand left pending
    # Shapes that did not fit. Within one call nothing frees up, so the same shape fails the same way again
    # and needs no second search (a cycle over thousands of identical waiting requests stays fast).
    failed: dict[tuple, Pending] = {}
    feasible: dict[tuple, tuple[int, int] | None] = {}  # shape -> (node, its version) that fits, or None
    for demand in demands:
        blocker = (
            None
            if backfill
            else next(
                (b for b in blockers.values() if b.priority > demand.priority and _overlap(b.models, demand.models)),
                None,
            )
        )
        if blocker is not None and engine.fits_now(demand, feasible):
            result.pending.append(
                Pending(
                    demand.id,
                    HIGHER_PRIORITY_AHEAD,
                    f"needs {demand.label}; it would fit now but is held back for {blocker.id} "
                    f"(priority {blocker.priority} > {demand.priority}) which is still pending",
                    {"blocked_by": blocker.id, "blocker_priority": blocker.priority, "priority": demand.priority},
                )
            )
            continue
        key = (DemandShape(demand).key, demand.replicas, demand.nodes, demand.level, demand.mode)
        known = failed.get(key)
        outcome = (
            engine.place_one(demand)
            if known is None
            else Pending(demand.id, known.reason, known.message, known.numbers)
        )
        if isinstance(outcome, Pending):
            result.pending.append(outcome)
            failed.setdefault(key, outcome)
            current = blockers.get(demand.models)
            # A demand that can never run holds nobody back: waiting behind it would be waiting for ever.
            if outcome.reason != NO_MATCHING_SPEC and (current is None or demand.priority > current.priority):
                blockers[demand.models] = demand
        else:
            result.bindings.extend(outcome)
    return result


def place(
    snapshot: Snapshot,
    demands: Sequence[Demand],
    policy: str = "default",
    seed: int = 0,
    workload: Iterable[Demand] | None = None,
    backfill: bool = False,
) -> PlacementResult:
    """One-shot placement: demands in priority order over a snapshot."""
    return PlacementEngine(snapshot, policy, seed=seed, workload=workload).place(demands, backfill=backfill)
