"""The MIG fragmentation score (scheduling/mig/__init__.py has the definition): the workload's demand classes and
typical shapes, what capacity each class could still use on a card, and the node's score. Pure Python."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping

from scheduling.mig.geometry import Geometry, max_pack
from scheduling.mig.model import MILLI, WHOLE, SliceDemand
from scheduling.mig.states import free_milli, profile_counts


def mix_weights(demands: Iterable[SliceDemand]) -> dict:
    """Popularity of each demand class (whole card, share, or profile) in the workload, summing to 1."""
    counts: dict = {}
    for demand in demands:
        klass = demand.klass
        if klass is not None:
            counts[klass] = counts.get(klass, 0) + 1
    total = sum(counts.values())
    return {klass: n / total for klass, n in counts.items()} if total else {(WHOLE, MILLI): 1.0}


def typical_shapes(demands: Iterable[SliceDemand], threshold: float = 0.95) -> list[tuple]:
    """The most popular (class, count, cpu) shapes covering ``threshold`` of the GPU demands, as
    (class, count, cpu, memory, weight) with weights summing to 1 (as FGD's typical pods)."""
    counts: dict = {}
    for demand in demands:
        klass = demand.klass
        if klass is not None:
            key = (klass, demand.count, demand.cpu_milli, 0)  # memory is not part of a shape, as in FGD
            counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values())
    chosen, covered = [], 0
    for key, n in sorted(counts.items(), key=lambda item: (-item[1], str(item[0]))):
        if covered >= threshold * total:
            break
        chosen.append((key, n))
        covered += n
    return [(*key, n / covered) for key, n in chosen]


class MigScore:
    """The score's parts for one workload over the cards' geometries, memoised by card state."""

    def __init__(self, geometries: Mapping[str, Geometry], workload: Iterable[SliceDemand]):
        self.geometries = geometries
        workload = list(workload)
        self.weights = mix_weights(workload)
        self.shapes = typical_shapes(workload)
        self.groups = _shape_groups(self.shapes)
        self.klasses = sorted({shape[0] for shape in self.shapes}, key=str)
        self._usable: dict = {}

    def usable(self, st, klass) -> float:
        """Capacity (milli) of one card state that demand class ``klass`` could still take."""
        key = (st, klass)
        cached = self._usable.get(key)
        if cached is None:
            cached = self._usable[key] = self._usable_now(st, klass)
        return cached

    def _usable_now(self, st, klass) -> float:
        kind = st[0]
        if kind == "p":
            return 0 if klass[0] == "slice" else (st[2] // klass[1]) * klass[1]
        if kind == "w":
            return MILLI if klass[0] == WHOLE else 0
        if kind == "m":
            if klass[0] == WHOLE:
                return MILLI if st[2] == 0 else 0
            if klass[0] != "slice":
                return 0.0
            g = self.geometries[st[1]]
            profile = g.profile(klass[1])
            if profile is None:
                return 0.0
            n = max_pack(g, profile, st[2], st[3], profile_counts(st[4]))
            return n * profile.memory_slices * MILLI / g.memory_slices
        if kind == "s" and klass[0] == "slice":
            g = self.geometries[st[1]]
            free = sum(
                size for (name, _s, size), busy in zip(st[2], st[3], strict=True) if not busy and name == klass[1]
            )
            return free * MILLI / g.memory_slices
        return 0.0

    def free_milli(self, st) -> float:
        return free_milli(st, self.geometries)

    def aggregate(self, cards: tuple) -> tuple[dict, float]:
        """Usable capacity per demand class and idle capacity, summed over a node's cards."""
        usable = self.usable
        return (
            {k: sum(usable(st, k) for st in cards) for k in self.klasses},
            sum(self.free_milli(st) for st in cards),
        )

    def node_frag(self, cpu: int, usable: Mapping, idle: float) -> float:
        """FGD over the typical shapes: a shape that cannot run on the node strands all its idle capacity, one
        that can strands what its class cannot use. As ``idle - sum(weight * room)`` over the shapes that fit,
        with the shapes of one (class, count) sorted by CPU: a bisection per group."""
        total = idle
        for klass, need, cpus, prefix in self.groups:
            room = usable.get(klass, 0.0)
            if room >= need:
                total -= room * prefix[bisect_right(cpus, cpu)]
        return total


def _shape_groups(shapes) -> list[tuple]:
    """Per (class, count): the class, the capacity one shape needs, its shapes' CPU sorted, and prefix weights."""
    groups: dict = {}
    for klass, count, cpu, _mem, weight in shapes:
        groups.setdefault((klass, count), []).append((cpu, weight))
    out = []
    for (klass, count), members in sorted(groups.items(), key=str):
        members.sort()
        prefix = [0.0]
        for _cpu, weight in members:
            prefix.append(prefix[-1] + weight)
        need = count * klass[1] if klass[0] != "slice" else 1
        out.append((klass, need, [cpu for cpu, _w in members], prefix))
    return out
