"""Placement engine: heterogeneous, health- and topology-aware GPU/NPU placement over an in-memory snapshot.

Pure Python, no Django: the scheduler service loads a `Snapshot`, calls `PlacementEngine(snapshot).place(demands)`
and commits the returned bindings. Units are integers: milli-CPU, MiB, and milli-device shares (1000 = one card).

Policies live in `scheduling.engine.policies`: ``fgd`` (Fragmentation Gradient Descent as in the FGD paper's simulator),
``bestfit`` and ``random`` baselines, ``fgd-pack`` (experimental) and ``fgd-plus``, the production ``default``: FGD
behind a model-pressure key that keeps contested models for the demands restricted to them.
Ties between equally scored nodes go to a fixed node order drawn from the engine's seed.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

from scheduling.engine.frag import MILLI, FragTable
from scheduling.engine.policies import Policy, RandomPolicy, make_policy

HEALTHY, DEGRADED, ISOLATED = "healthy", "degraded", "isolated"

NO_MATCHING_SPEC = "no_matching_spec"
INSUFFICIENT_HEALTHY_CAPACITY = "insufficient_healthy_capacity"
CAPACITY_IN_USE = "capacity_in_use"
TOPOLOGY_CONSTRAINT = "topology_constraint"
FRAGMENTATION = "fragmentation"
HIGHER_PRIORITY_AHEAD = "higher_priority_ahead"
REASONS = (
    NO_MATCHING_SPEC,
    INSUFFICIENT_HEALTHY_CAPACITY,
    CAPACITY_IN_USE,
    TOPOLOGY_CONSTRAINT,
    FRAGMENTATION,
    HIGHER_PRIORITY_AHEAD,
)


# ---------------------------------------------------------------------------------------------------- data model


@dataclass(frozen=True)
class DeviceView:
    """A card as the engine sees it: a frozen copy of what the inventory says (not the `scheduling.models.Device`
    row). ``index`` is its position on its node, the one bindings name."""

    index: int
    model: str
    vendor: str = "nvidia"
    memory_mib: int = 0
    capacity: int = MILLI  # whole-card capacity in milli-shares
    health: str = HEALTHY
    slice_profiles: Mapping[str, int] = field(default_factory=dict)  # MIG profile -> milli-share it occupies


@dataclass(frozen=True)
class NodeView:
    """A node as the engine sees it, with its cards: a frozen copy, not the `scheduling.models.Node` row."""

    name: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[DeviceView, ...] = ()
    schedulable: bool = True
    capabilities: frozenset = frozenset()  # what else the node offers work, e.g. a serving runtime's model file


@dataclass(frozen=True)
class RunningAllocation:
    """Work that runs now, as the snapshot holds it (not the `scheduling.models.Allocation` row): devices is a tuple
    of (device index, milli). A `Binding` is new work the engine placed; running it makes it one of these."""

    id: str
    node: str
    devices: tuple[tuple[int, int], ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    preemptible: bool = False
    started_at: float = 0.0


@dataclass(frozen=True)
class Demand:
    """What to place. ``share`` is milli per device (1000 = whole card); ``slice_profile`` asks for a MIG slice
    instead (its share comes from each device's profile table). ``models`` empty means any model. A demand runs on
    one node, on healthy devices only (multi-node gangs come with multi-node specs).

    ``replicas`` > 1 asks for that many copies of the shape (a serving deployment's replicas: count, CPU and memory
    are each replica's): placed as a gang, all of them in one call or none, each on a node that holds none of the
    others while one has room (soft anti-affinity: when too few nodes have room they share, evenly).

    ``needs`` are capabilities the node must offer besides devices, CPU and memory (a serving runtime installed
    with the model's file: catalog.runtimes); ``needs_label`` says them in words for the reasons."""

    id: str
    count: int = 1
    share: int = MILLI
    slice_profile: str | None = None
    models: frozenset = frozenset()
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    preemptible: bool = False
    replicas: int = 1
    needs: frozenset = frozenset()
    needs_label: str = field(default="", compare=False)

    @property
    def label(self) -> str:
        what = "/".join(sorted(self.models)) or "any"
        per = self.slice_profile or ("" if self.share >= MILLI else f"{cards_text(self.share)} of ")
        one = f"{self.count}×{per}{what}"  # noqa: RUF001
        return f"{self.replicas} replicas of {one}" if self.replicas > 1 else one

    @property
    def replica(self) -> Demand:
        """One replica of the demand, as a demand of its own."""
        return replace(self, replicas=1)

    @property
    def colocated(self) -> Demand:
        """All replicas as one demand on one node (for placers without anti-affinity: the MIG engine)."""
        n = self.replicas
        return replace(
            self, count=self.count * n, cpu_milli=self.cpu_milli * n, memory_mib=self.memory_mib * n, replicas=1
        )


@dataclass(frozen=True)
class Snapshot:
    nodes: Sequence[NodeView]
    allocations: Sequence[RunningAllocation] = ()


@dataclass(frozen=True)
class Binding:
    demand_id: str
    node: str
    devices: tuple[tuple[int, int], ...]  # (device index, milli)
    cpu_milli: int
    memory_mib: int
    replica: int | None = None  # which replica of a replicated demand; None: the demand is not replicated


@dataclass(frozen=True)
class Pending:
    demand_id: str
    reason: str
    message: str
    numbers: Mapping[str, object] = field(default_factory=dict)


@dataclass
class PlacementResult:
    bindings: list[Binding] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)


@dataclass(frozen=True)
class PreemptionPlan:
    feasible: bool
    node: str | None = None
    victims: tuple[str, ...] = ()
    message: str = ""


# ---------------------------------------------------------------------------------------------------- the engine


class _Shape:
    """Resolved demand shape for the cached path: per-model share, compatible models."""

    __slots__ = ("count", "cpu", "devices_key", "key", "mem", "models", "needs", "profile", "share")

    def __init__(self, demand: Demand):
        self.cpu, self.mem, self.count = demand.cpu_milli, demand.memory_mib, demand.count
        self.share, self.models, self.profile = demand.share, demand.models, demand.slice_profile
        self.needs = demand.needs
        self.key = (self.cpu, self.mem, self.count, self.share, self.models, self.profile, self.needs)
        self.devices_key = (self.count, self.share, self.models, self.profile)  # what it needs of the devices


class PlacementEngine:
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
        self._rooms: dict = {}
        self._blocks: dict = {}  # (models, share) -> _BlockIndex, for topology pending reasons
        self._slices_by_model = _one_slice_table_per_model(self.nodes)
        self._able: dict[frozenset, frozenset[int]] = {}  # needs -> the nodes offering them (a pure cache)
        self._alike_cache: dict = {}  # since -> the nodes changed since then, grouped (`_alike`)
        self._alike_at = (0, 0)  # the change list length and generation the groupings were made at (the state)
        self._build_aggregates()
        self.policy.attach(self.model_healthy)

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
        forked._blocks = {}  # per-node counts that the fork's placements would change under the original
        forked._alike_cache = {}  # the fork's own changes group differently
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
        self._blocks = {}

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

    # -- evaluation -------------------------------------------------------------------------------------------

    def _share(self, shape: _Shape, model: str, node: NodeView | None = None) -> int | None:
        if shape.models and model not in shape.models:
            return None
        if shape.profile is None:
            return shape.share
        for device in node.devices if node else ():
            if device.model == model:
                return device.slice_profiles.get(shape.profile)
        return None

    def _gpu_options(self, devs: tuple, shape: _Shape, node: NodeView):
        """Ways to take the shape's devices from a device tuple: list of (new device tuple, picks, need)."""
        memo_key = (devs, shape.count, shape.share, shape.models, shape.profile, node.name if shape.profile else None)
        options = self._gpu_memo.get(memo_key)
        if options is not None:
            return options
        options = []
        if shape.count == 0:
            options.append((devs, (), 0))
        else:
            shares = {}
            eligible = []  # positions in devs, ascending free milli (the simulator's packing order)
            for position, (model, free) in enumerate(devs):
                if model not in shares:
                    shares[model] = self._share(shape, model, node)
                share = shares[model]
                if share is not None and free >= share:
                    eligible.append(position)
            if len(eligible) >= shape.count:
                if (shape.count == 1 and shape.share < MILLI) or shape.profile:
                    seen = set()
                    for position in eligible:  # each distinct (model, free) is one option
                        model, free = devs[position]
                        if (model, free) in seen:
                            continue
                        seen.add((model, free))
                        new = list(devs)
                        new[position] = (model, free - shares[model])
                        options.append((tuple(sorted(new)), (((model, free),),), shares[model]))
                else:
                    eligible.sort(key=lambda position: devs[position][1])
                    taken = eligible[: shape.count]
                    new = list(devs)
                    picks = []
                    need = 0
                    for position in taken:
                        model, free = devs[position]
                        new[position] = (model, free - shares[model])
                        picks.append(((model, free),))
                        need += shares[model]
                    options.append((tuple(sorted(new)), tuple(picks), need))
        self._gpu_memo[memo_key] = options
        return options

    def _evaluate(self, state, shape: _Shape, node: NodeView):
        """Best (key, picks) for this node state, or None when the shape cannot run there."""
        cpu, mem, devs = state
        if shape.cpu > cpu or shape.mem > mem:
            return None
        options = self._gpu_options(devs, shape, node)
        return self._score(state, shape, options) if options else None

    def _score(self, state, shape: _Shape, options):
        """Best (key, picks) among the ways to take the shape's devices from this node state."""
        cpu, mem, devs = state
        new_cpu, new_mem = cpu - shape.cpu, mem - shape.mem
        best = None
        key_fn = self.policy.key
        for new_devs, picks, need in options:
            key = key_fn(cpu, mem, devs, new_cpu, new_mem, new_devs, need, picks)
            if best is None or key < best[0]:
                best = (key, picks)
            elif key == best[0] and picks:  # equal scores: any of these device values, first index wins
                best = (key, tuple(a + b for a, b in zip(best[1], picks, strict=True)))
        return best

    def _index(self, shape: _Shape):
        index = self._indexes.get(shape.key)
        if index is None:
            if self._origin is None:
                index = _ShapeIndex(shape)
            elif self._origin.generation != self._origin_generation:
                raise RuntimeError("the engine this one was forked from has advanced: fork it again")
            else:
                index = self._origin._shared_index(shape).copy()
            self._indexes[shape.key] = index
        return index

    def _shared_index(self, shape: _Shape):
        """The shape's index over this frozen engine's state, for forks to copy (built once, by one thread)."""
        with self._index_lock:
            index = self._index(shape)
            self._refresh(index, shape)
            return index

    def _best_node(self, shape: _Shape, excluded: frozenset | set = frozenset()):
        """(node index, picks) of the best feasible schedulable node not in `excluded`, or None."""
        if self.is_random:
            return self._random_node(shape, excluded)
        index = self._index(shape)
        self._refresh(index, shape)
        heap, version = index.heap, self.version
        skipped = []  # current entries of excluded nodes: back on the heap afterwards, they are still valid
        found = None
        while heap:
            _key, _rank, i, ver, picks = heap[0]
            if ver != version[i]:
                heapq.heappop(heap)
            elif i in excluded:
                skipped.append(heapq.heappop(heap))
            else:
                found = i, picks
                break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def _refresh(self, index: _ShapeIndex, shape: _Shape):
        """Score the nodes changed since the index last looked (all of them the first time) into its heap."""
        alike = self._alike(index.seen)
        index.seen = len(self.changed)
        # Whether and how the shape's devices can be taken depends on the device tuple alone (and for a slice profile
        # on the node's slice tables, the same on every node when each model has one).
        if shape.profile and not self._slices_by_model:
            entries = self._entries_per_node(index, shape, alike)
        else:
            entries = self._entries_alike(index, shape, alike)
        heap, version = index.heap, self.version
        if len(heap) + len(entries) > 2 * len(self.nodes) + 64:
            # Stale entries (nodes changed since they were pushed) would otherwise pile up with every placement:
            # keep the live ones, so the heap stays as large as the fleet, not as the history of its changes.
            heap[:] = [entry for entry in heap if entry[3] == version[entry[2]]]
        if len(entries) > len(heap):  # the first look, or most nodes changed: one O(n) heapify, not n pushes
            heap.extend(entries)
            heapq.heapify(heap)
        else:
            push = heapq.heappush
            for entry in entries:
                push(heap, entry)

    def _alike(self, since: int | None) -> dict[int, dict[tuple[int, int], list[int]]]:
        """The schedulable nodes changed since position `since` of the change list (all of them when None), by device
        tuple id and then by free CPU and memory: nodes alike in both take a shape the same way and score the same.
        A full fleet is a few hundred device tuples and a few thousand such states. The groupings are kept while the
        state does not move: a cycle's start state (frozen) and a compaction refresh most shapes from the same point."""
        now = (len(self.changed), self.generation)
        if self._alike_at != now:
            self._alike_cache, self._alike_at = {}, now
        groups = self._alike_cache.get(since)
        if groups is not None:
            return groups
        nodes, state, dsid = self.nodes, self.state, self.dsid
        groups = {}
        for i in range(len(nodes)) if since is None else set(self.changed[since:]):
            if nodes[i].schedulable:
                cpu, mem, _devs = state[i]
                groups.setdefault(dsid[i], {}).setdefault((cpu, mem), []).append(i)
        self._alike_cache[since] = groups
        return groups

    def _entries_alike(self, index: _ShapeIndex, shape: _Shape, alike) -> list[tuple]:
        """Heap entries for the nodes in `alike` that can take the shape: one lookup per device tuple (its ways to
        take the shape's devices are kept by id), one score per device tuple and CPU class (with CPU classes, the free
        CPU before and after only matters up to the typical shapes' core counts)."""
        takes = self._takes.setdefault(shape.devices_key, {})
        rank, version, state, memo = self.rank, self.version, self.state, index.memo
        able = self.able(shape.needs)
        cpu_class, shape_cpu, shape_mem = self.policy.cpu_class, shape.cpu, shape.mem
        entries: list[tuple] = []
        for d, states in alike.items():
            options = takes.get(d)
            if options is None:
                some = next(iter(states.values()))[0]
                options = takes[d] = self._gpu_options(state[some][2], shape, self.nodes[some])
            if not options:
                continue
            for (cpu, mem), members in states.items():
                if cpu < shape_cpu or mem < shape_mem:
                    continue
                memo_key = (d, cpu_class(cpu), cpu_class(cpu - shape_cpu)) if cpu_class else (d, cpu, mem)
                result = memo.get(memo_key)
                if result is None:
                    result = memo[memo_key] = self._score(state[members[0]], shape, options)
                key, picks = result
                entries += [(key, rank[i], i, version[i], picks) for i in members if able is None or i in able]
        return entries

    def _entries_per_node(self, index: _ShapeIndex, shape: _Shape, alike) -> list[tuple]:
        """Heap entries for a slice shape on a fleet whose slice tables differ between nodes of one model: each node
        is evaluated with its own tables."""
        rank, version, state, nodes, memo = self.rank, self.version, self.state, self.nodes, index.memo
        able = self.able(shape.needs)
        entries = []
        for d, states in alike.items():
            for (cpu, mem), members in states.items():
                if cpu < shape.cpu or mem < shape.mem:
                    continue
                for i in members if able is None else [i for i in members if i in able]:
                    memo_key = (d, cpu, mem, i)
                    result = memo.get(memo_key, _MISSING)
                    if result is _MISSING:
                        result = memo[memo_key] = self._evaluate(state[i], shape, nodes[i])
                    if result is not None:
                        entries.append((result[0], rank[i], i, version[i], result[1]))
        return entries

    def _random_node(self, shape: _Shape, excluded: frozenset | set = frozenset()):
        pool = list(range(len(self.nodes)))
        self.rng.shuffle(pool)
        able = self.able(shape.needs)
        for i in pool:
            if not self.nodes[i].schedulable or i in excluded or (able is not None and i not in able):
                continue
            result = self._evaluate(self.state[i], shape, self.nodes[i])
            if result is not None:
                picks = result[1]
                if picks and len(picks) == 1 and len(picks[0]) > 1:  # shared: a random eligible device value
                    picks = ((self.rng.choice(sorted(picks[0])),),)
                return i, picks
        return None

    def _choose_devices(self, i: int, picks, shape: _Shape):
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
        """Bind one demand now (every replica of a replicated one), or say why it waits."""
        if demand.replicas > 1:
            placed = self._bind_gang(demand)
            return placed if isinstance(placed, list) else self._gang_pending(demand, placed)
        shape = _Shape(demand)
        found = self._best_node(shape)
        if found is None:
            return self.diagnose(demand)
        return [self._bind(demand, shape, *found)]

    def _bind(self, demand: Demand, shape: _Shape, i: int, picks, replica: int | None = None) -> Binding:
        devices = self._choose_devices(i, picks, shape)
        self._apply(i, devices, demand.cpu_milli, demand.memory_mib)
        return Binding(demand.id, self.nodes[i].name, devices, demand.cpu_milli, demand.memory_mib, replica)

    def _bind_gang(self, demand: Demand) -> list[Binding] | tuple[str, ...]:
        """Every replica bound, each on the best node among those holding the fewest of its replicas so far; or,
        when one does not fit, none (what was bound is given back) and the nodes the ones that fitted took."""
        shape = _Shape(demand)
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

    def _spread_node(self, shape: _Shape, held: dict[int, int]):
        """The best node holding none of the gang's replicas; failing that (too few nodes have room) one holding
        the fewest, so that sharing stays even."""
        for level in sorted({0, *held.values()}):
            found = self._best_node(shape, {i for i, n in held.items() if n > level})
            if found is not None:
                return found
        return None

    def _gang_pending(self, demand: Demand, fitted: tuple[str, ...]) -> Pending:
        if not fitted:  # not even one replica fits: why, in the words of one replica
            why = self.diagnose(demand.replica)
            return Pending(
                demand.id,
                why.reason,
                f"each of its {demand.replicas} replicas {why.message}",
                {**why.numbers, "replicas": demand.replicas, "replicas_fitting": 0},
            )
        return Pending(
            demand.id,
            CAPACITY_IN_USE,
            f"needs {demand.label} with {cores_text(demand.cpu_milli)} and {memory_text(demand.memory_mib)} each, "
            f"all placed together; only {len(fitted)} fit now, even sharing nodes ({', '.join(sorted(set(fitted)))})",
            {"replicas": demand.replicas, "replicas_fitting": len(fitted), "nodes": sorted(set(fitted))},
        )

    def fits(self, demand: Demand) -> bool:
        if demand.replicas > 1:  # all the replicas: bound on trial, then given back
            placed = self._bind_gang(demand)
            if not isinstance(placed, list):
                return False
            for binding in placed:
                self.release(binding)
            return True
        return self._best_node(_Shape(demand)) is not None

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
        the node it fits on is unchanged. A replicated demand is tried as the gang it is."""
        if demand.replicas > 1:
            return self.fits(demand)
        shape = _Shape(demand)
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

    def _feasible(self, i: int, shape: _Shape) -> bool:
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
        """Why a demand cannot be placed now, with numbers (cluster-wide counts from incremental aggregates)."""
        never = self.never_fits(demand)
        if never is not None:
            return never
        if demand.needs:
            return self._diagnose_needs(demand)
        models = [m for m in self.model_devices if not demand.models or m in demand.models]
        label = demand.label
        total = sum(self.model_devices[m] for m in models)
        needed = demand.count
        if total == 0:  # the inventory has such devices, but only on cordoned nodes
            return Pending(
                demand.id,
                INSUFFICIENT_HEALTHY_CAPACITY,
                f"needs {label}; every node with such devices is cordoned",
                {"needed": needed, "devices": 0},
            )
        healthy = sum(self.model_healthy.get(m, 0) for m in models)
        usable = healthy
        share = demand.share if not demand.slice_profile else self._profile_share(demand, models)
        if usable < needed or share is None:
            detail = (
                f"only {total} exist in the cluster"
                if total < needed
                else f"{total} exist but only {usable} are healthy ({total - usable} isolated or unhealthy)"
            )
            return Pending(
                demand.id,
                INSUFFICIENT_HEALTHY_CAPACITY,
                f"needs {label}; {detail}",
                {"needed": needed, "devices": total, "healthy": usable},
            )
        fitting = 0
        free_milli = 0
        for m in models:
            for free, n in self.model_hist.get(m, {}).items():
                free_milli += free * n
                if free >= share:
                    fitting += n
        if fitting >= needed:
            block, node = self._largest_block(demand, models, share) if needed > 1 else (1, None)
            if block < needed:
                where = f"node {node}" if node else "no node"
                return Pending(
                    demand.id,
                    TOPOLOGY_CONSTRAINT,
                    f"needs {label} on one node; {fitting} fitting devices are free in total but the "
                    f"largest free block is {block} on {where}",
                    {"needed": needed, "free_devices": fitting, "largest_block": block, "largest_block_node": node},
                )
            return Pending(
                demand.id,
                CAPACITY_IN_USE,
                f"needs {label} with {cores_text(demand.cpu_milli)} and {memory_text(demand.memory_mib)}; the "
                f"nodes with {needed} free fitting devices have not that much CPU or memory left",
                {
                    "needed": needed,
                    "free_devices": fitting,
                    "cpu_milli": demand.cpu_milli,
                    "memory_mib": demand.memory_mib,
                },
            )
        if free_milli >= needed * share:
            return Pending(
                demand.id,
                FRAGMENTATION,
                f"needs {label} ({cards_text(needed * share)}); {cards_text(free_milli)} are free in total but "
                f"split so that only {fitting} device(s) have {cards_text(share)} free",
                {"needed_milli": needed * share, "free_milli": free_milli, "fitting_devices": fitting},
            )
        return Pending(
            demand.id,
            CAPACITY_IN_USE,
            f"needs {label} ({cards_text(needed * share)}); {usable} healthy devices exist but only "
            f"{cards_text(free_milli)} are free",
            {"needed_milli": needed * share, "free_milli": free_milli, "healthy": usable},
        )

    def _diagnose_needs(self, demand: Demand) -> Pending:
        """Why a demand that needs capabilities some nodes offer cannot be placed now: those nodes are cordoned, or
        have not the room (the cluster-wide counts of the other reasons would count nodes it cannot use)."""
        offering = sorted(self.nodes[i].name for i in self.able(demand.needs))
        open_ = [name for name in offering if self.nodes[self.node_index[name]].schedulable]
        what = f"needs {demand.label} on a node with {_needs_words(demand)}"
        if not open_:
            return Pending(
                demand.id,
                INSUFFICIENT_HEALTHY_CAPACITY,
                f"{what}; every such node ({_names(offering)}) is cordoned",
                {"nodes": offering, "schedulable": 0},
            )
        return Pending(
            demand.id,
            CAPACITY_IN_USE,
            f"{what}, {cores_text(demand.cpu_milli)} and {memory_text(demand.memory_mib)}; the nodes with it "
            f"({_names(open_)}) have not that much free",
            {"nodes": open_, "cpu_milli": demand.cpu_milli, "memory_mib": demand.memory_mib},
        )

    def never_fits(self, demand: Demand) -> Pending | None:
        """`unplaceable` over this engine's inventory; the rooms are worked out once per kind of device asked for
        (the inventory does not change while the engine lives)."""
        key = (demand.models, demand.slice_profile, demand.share, demand.needs)
        if key not in self._rooms:
            self._rooms[key] = _rooms(self.nodes, demand)
        return _never_fits(self._rooms[key], demand)

    def _profile_share(self, demand: Demand, models) -> int | None:
        """The smallest share the profile takes on the models (the inventory's slice tables do not change while
        the engine lives: worked out once per profile and models, not once per pending demand)."""
        key = ("profile-share", demand.slice_profile, frozenset(models))
        if key not in self._rooms:
            shares = [
                d.slice_profiles[demand.slice_profile]
                for node in self.nodes
                for d in node.devices
                if d.model in models and demand.slice_profile in d.slice_profiles
            ]
            self._rooms[key] = min(shares) if shares else None
        return self._rooms[key]

    def _largest_block(self, demand: Demand, models, share: int):
        """(devices, node) of the schedulable node with the most healthy devices of the models with `share`
        free (ties: the first name). Kept per (models, share) and brought up to date from the nodes changed since
        it last looked, so a pending reason costs what changed, not the whole fleet."""
        key = (frozenset(models), share)
        blocks = self._blocks.get(key)
        if blocks is None:
            blocks = self._blocks[key] = _BlockIndex(len(self.nodes))
            todo: Iterable[int] = range(len(self.nodes))
        else:
            todo = set(self.changed[blocks.seen :])
        blocks.seen = len(self.changed)
        for i in todo:
            node = self.nodes[i]
            if node.schedulable:
                free = self.free[i]
                block = sum(
                    1
                    for j, d in enumerate(node.devices)
                    if d.model in key[0] and d.health == HEALTHY and free[j] >= share
                )
            else:
                block = 0
            blocks.move(i, block)
        best = blocks.best()
        if best == 0:
            return 0, None
        return best, min(self.nodes[i].name for i in blocks.by_block[best])

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
        demand fit: fewest victims, then lowest priorities, then youngest. Exhaustive per node by victim count.
        ``evictable`` replaces the allocations' own preemptible flag (the caller's rules say who may evict whom), so
        one engine serves every class and tenant instead of one engine built per rule set. The state is left as it
        was: planning evicts and puts back. A replicated demand is not planned for (its replicas would need room on
        several nodes): it waits."""
        if self.fits(demand):
            return PreemptionPlan(True, message="fits without preemption")
        if demand.replicas > 1:
            return PreemptionPlan(
                False, message=f"needs {demand.label}; preemption is planned for one-node demands only"
            )
        shape = _Shape(demand)
        may_evict = evictable or (lambda allocation: allocation.preemptible)
        by_node: dict[int, list[RunningAllocation]] = {}
        able = self.able(demand.needs)
        for allocation in self.allocations:
            i = self.node_index[allocation.node]
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
            True, self.nodes[i].name, ids, f"evict {len(ids)} allocation(s) on {self.nodes[i].name}: {', '.join(ids)}"
        )

    def _fits_without(self, i: int, subset, shape: _Shape) -> bool:
        for a in subset:
            self._apply(i, a.devices, a.cpu_milli, a.memory_mib, sign=+1, refresh=False)
        try:
            return self._evaluate(self._state(i), shape, self.nodes[i]) is not None
        finally:
            for a in subset:
                self._apply(i, a.devices, a.cpu_milli, a.memory_mib, refresh=False)


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


# ---------------------------------------------------------------------------------------------------- replicas


REPLICAS_SHARE_NODE = "replicas_share_node"


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


# ---------------------------------------------------------------------------------------------------- never fits


def unplaceable(nodes: Sequence[NodeView], demand: Demand) -> Pending | None:
    """`no_matching_spec` when no node of the inventory could hold the demand even empty;
    None when one could.

    Every node counts, cordoned ones and isolated or unhealthy devices included: they can come back, so they make a
    demand wait (`insufficient_healthy_capacity`), never "never fits". The reason names the blocking dimension and
    the largest node: compatible devices first, then cores among the nodes with enough devices, then memory among
    those with enough devices and cores. No database.
    """
    return _never_fits(_rooms(nodes, demand), demand)


def _rooms(nodes: Sequence[NodeView], demand: Demand) -> list[tuple[int, int, int, int, str]]:
    """What an empty node offers the demand's kind of device: (devices that could take a share, cores in milli,
    memory in MiB, devices of the wanted models, node name), once per distinct size (its first node by inventory
    order), so that an inventory of thousands of nodes of a few types is a few rooms."""
    rooms: dict[tuple, str] = {}
    for node in nodes:
        if not demand.needs <= node.capabilities:
            continue
        size = (
            sum(1 for device in node.devices if _could_hold(device, demand)),
            node.cpu_milli,
            node.memory_mib,
            sum(1 for device in node.devices if _of_model(device, demand)),
        )
        rooms.setdefault(size, node.name)
    return [(*size, name) for size, name in rooms.items()]


def _never_fits(rooms, demand: Demand) -> Pending | None:
    wanted = "/".join(sorted(demand.models)) or "accelerator"
    if demand.needs and not rooms:
        return Pending(
            demand.id,
            NO_MATCHING_SPEC,
            f"needs {demand.label} on a node with {_needs_words(demand)}; no node of the inventory has it, so it "
            "cannot run here",
            {"dimension": "runtime", "needs": sorted(demand.needs), "nodes": 0},
        )
    if demand.count and not any(room[3] for room in rooms):
        return Pending(
            demand.id,
            NO_MATCHING_SPEC,
            f"needs {demand.label}; no {wanted} device exists in the cluster"
            if not demand.needs
            else f"needs {demand.label} on a node with {_needs_words(demand)}; no such node has a {wanted} device, so "
            "it cannot run here",
            {"needed": demand.count, "devices": 0},
        )
    kind = f"{wanted} devices" + (f" with {demand.slice_profile} slices" if demand.slice_profile else "")
    dimensions = (
        ("devices", demand.count, 1, kind),
        ("cpu_cores", demand.cpu_milli, 1000, "cores"),
        ("memory_gib", demand.memory_mib, 1024, "GiB of memory"),
    )
    for position, (dimension, needed, unit, what) in enumerate(dimensions):
        holding = [room for room in rooms if room[position] >= needed]
        if holding:
            rooms = holding
            continue
        largest = max(rooms, key=lambda room: room[position])  # the first such node in inventory order
        numbers = {
            "dimension": dimension,
            "needed": _in_units(needed, unit),
            "largest": _in_units(largest[position], unit),
            "node": largest[4],
        }
        return Pending(
            demand.id,
            NO_MATCHING_SPEC,
            f"needs {demand.label} with {_in_units(demand.cpu_milli, 1000)} cores and "
            f"{_in_units(demand.memory_mib, 1024)} GiB on one node; no node has {numbers['needed']} "
            f"{what}: the largest {wanted} node has {numbers['largest']} ({largest[4]}), so it can "
            f"never run on this inventory",
            numbers,
        )
    return None


def _of_model(device: DeviceView, demand: Demand) -> bool:
    return not demand.models or device.model in demand.models


def _could_hold(device: DeviceView, demand: Demand) -> bool:
    """Whether the device, free, could take one of the demand's shares (whatever its health now)."""
    share = device.slice_profiles.get(demand.slice_profile) if demand.slice_profile else demand.share
    return _of_model(device, demand) and share is not None and share <= device.capacity


def _needs_words(demand: Demand) -> str:
    return demand.needs_label or ", ".join(sorted(demand.needs))


def _names(names: list[str], shown: int = 5) -> str:
    """A few node names for a sentence, and how many more there are."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


# Reasons people read say cores, GiB/TiB and cards; the milli and MiB the engine counts in stay in their numbers.
def cores_text(cpu_milli: int) -> str:
    return f"{_in_units(cpu_milli, MILLI)} CPU cores"


def memory_text(memory_mib: int) -> str:
    gib = memory_mib / 1024
    return (
        f"{_in_units(memory_mib, 1024 * 1024)} TiB memory"
        if gib >= 1024
        else f"{_in_units(memory_mib, 1024)} GiB memory"
    )


def cards_text(milli: int) -> str:
    cards = _in_units(milli, MILLI)
    return f"{cards} card" if cards == 1 else f"{cards} cards"


def _in_units(amount: int, unit: int) -> int | float:
    value = amount / unit
    return int(value) if value.is_integer() else round(value, 2)


def victim_key(subset) -> tuple:
    priorities = sorted((a.priority for a in subset), reverse=True)
    return (len(subset), priorities, -sum(a.started_at for a in subset), tuple(sorted(a.id for a in subset)))


def _overlap(a: frozenset, b: frozenset) -> bool:
    return not a or not b or bool(a & b)


_MISSING = object()


class _ShapeIndex:
    """Per demand shape: a lazy max-heap of node scores, refreshed only for nodes changed since the last query."""

    __slots__ = ("heap", "memo", "seen", "shape")

    def __init__(self, shape: _Shape, heap: list | None = None, memo: dict | None = None, seen: int | None = None):
        self.shape = shape
        self.heap: list = [] if heap is None else heap
        self.memo: dict = {} if memo is None else memo
        self.seen: int | None = seen

    def copy(self) -> _ShapeIndex:
        """Its own heap to pop from; the memo of scores by node state stays shared (a pure cache)."""
        return _ShapeIndex(self.shape, list(self.heap), self.memo, self.seen)


class _BlockIndex:
    """Per (models, share): each node's count of healthy devices with that much free, and the nodes by count."""

    __slots__ = ("by_block", "per_node", "seen")

    def __init__(self, nodes: int):
        self.per_node = [0] * nodes
        self.by_block: dict[int, set[int]] = {0: set(range(nodes))}
        self.seen = 0

    def move(self, i: int, block: int) -> None:
        before = self.per_node[i]
        if before != block:
            self.by_block[before].discard(i)
            if not self.by_block[before]:
                del self.by_block[before]
            self.by_block.setdefault(block, set()).add(i)
            self.per_node[i] = block

    def best(self) -> int:
        return max(self.by_block) if self.by_block else 0


def _one_slice_table_per_model(nodes: Sequence[NodeView]) -> bool:
    """Whether every device of a model has the same slice-profile table (an inventory's tables are per model), so
    that what a slice takes of a device follows from its model alone, whatever node it is on."""
    tables: dict[str, Mapping[str, int]] = {}
    for node in nodes:
        for device in node.devices:
            table = tables.setdefault(device.model, device.slice_profiles)
            if table is not device.slice_profiles and table != device.slice_profiles:
                return False
    return True


def workload_source(demands: Iterable[Demand]) -> list[tuple[int, int, int, int, frozenset]]:
    """Demands as a policy learns its typical shapes from them."""
    return [(d.cpu_milli, d.memory_mib, d.count, d.share, d.models) for d in demands]


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
        key = (_Shape(demand).key, demand.replicas)
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
