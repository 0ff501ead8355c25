"""Scoring: which node is best for a demand shape, as the engine's policy ranks them.

Each shape has a lazy heap of node scores (`_ShapeIndex`), scored once per node and then again only for the nodes
changed since it last looked; nodes alike in their device tuple and free CPU and memory are scored once. A fork
copies the heaps of the engine it came from instead of scoring every node again.

`ShapeScores` is the scoring half of `PlacementEngine` (place.py), which inherits it: it reads the state the
engine keeps (free capacity per node, the change list, the policy) and never changes it; what it writes is its own
caches.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from scheduling.engine.frag import MILLI
from scheduling.engine.model import DemandShape, NodeView


class ShapeScores:
    """Which node is best for a shape. Reads the engine's `nodes`, `state` (free CPU, memory and device tuple per
    node), `dsid`, `version`, `changed`, `rank`, `rng`, `policy`, `is_random`, `generation` and `able`; keeps its own
    caches, made by `PlacementEngine.__init__` and `fork`: `_indexes` (per shape, a `_ShapeIndex`), `_gpu_memo` and
    `_takes` (ways to take a shape's devices), `_alike_cache`/`_alike_at`, `_slices_by_model`, and `_origin`,
    `_origin_generation`, `_index_lock` (the frozen engine a fork copies its indexes from)."""

    def _share(self, shape: DemandShape, model: str, node: NodeView | None = None) -> int | None:
        if shape.models and model not in shape.models:
            return None
        if shape.profile is None:
            return shape.share
        for device in node.devices if node else ():
            if device.model == model:
                return device.slice_profiles.get(shape.profile)
        return None

    def _gpu_options(self, devs: tuple, shape: DemandShape, node: NodeView):
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

    def _evaluate(self, state, shape: DemandShape, node: NodeView):
        """Best (key, picks) for this node state, or None when the shape cannot run there."""
        cpu, mem, devs = state
        if shape.cpu > cpu or shape.mem > mem:
            return None
        options = self._gpu_options(devs, shape, node)
        return self._score(state, shape, options) if options else None

    def _score(self, state, shape: DemandShape, options):
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

    def _index(self, shape: DemandShape):
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

    def _shared_index(self, shape: DemandShape):
        """The shape's index over this frozen engine's state, for forks to copy (built once, by one thread)."""
        with self._index_lock:
            index = self._index(shape)
            self._refresh(index, shape)
            return index

    def _best_node(self, shape: DemandShape, excluded: frozenset | set = frozenset()):
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

    def _refresh(self, index: _ShapeIndex, shape: DemandShape):
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

    def _entries_alike(self, index: _ShapeIndex, shape: DemandShape, alike) -> list[tuple]:
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

    def _entries_per_node(self, index: _ShapeIndex, shape: DemandShape, alike) -> list[tuple]:
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

    def _random_node(self, shape: DemandShape, excluded: frozenset | set = frozenset()):
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


_MISSING = object()


class _ShapeIndex:
    """Per demand shape: a lazy max-heap of node scores, refreshed only for nodes changed since the last query."""

    __slots__ = ("heap", "memo", "seen", "shape")

    def __init__(self, shape: DemandShape, heap: list | None = None, memo: dict | None = None, seen: int | None = None):
        self.shape = shape
        self.heap: list = [] if heap is None else heap
        self.memo: dict = {} if memo is None else memo
        self.seen: int | None = seen

    def copy(self) -> _ShapeIndex:
        """Its own heap to pop from; the memo of scores by node state stays shared (a pure cache)."""
        return _ShapeIndex(self.shape, list(self.heap), self.memo, self.seen)


def one_slice_table_per_model(nodes: Sequence[NodeView]) -> bool:
    """Whether every device of a model has the same slice-profile table (an inventory's tables are per model), so
    that what a slice takes of a device follows from its model alone, whatever node it is on."""
    tables: dict[str, Mapping[str, int]] = {}
    for node in nodes:
        for device in node.devices:
            table = tables.setdefault(device.model, device.slice_profiles)
            if table is not device.slice_profiles and table != device.slice_profiles:
                return False
    return True
