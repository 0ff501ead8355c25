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
            # the models it may use are part of its class (FGD's typical pods carry their GPU-type constraint)
            key = ((*klass, demand.models), demand.count, demand.cpu_milli, 0)  # memory is not, as in FGD
            counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values())
    chosen, covered = [], 0
    for key, n in sorted(counts.items(), key=lambda item: (-item[1], str(item[0]))):
        if covered >= threshold * total:
            break
        chosen.append((key, n))
        covered += n
    return [(*key, n / covered) for key, n in chosen]


def model_pressure(nodes, geometries: Mapping[str, Geometry], workload: Iterable[SliceDemand]) -> dict[str, float]:
    """How contested each card model is (as the milli-share engine's ``fgd-plus``): the share of the GPU demand that
    may run only on a model set containing it, spread over that set's cards (sum of the capacity such demands ask
    for / cards of the set, per GPU demand of the workload). A slice may run only on MIG-capable models, so their
    cards are contested by every slice. A demand that may use several models goes to the least contested one that
    fits; with no constrained demand every pressure is 0 and the fragmentation score alone decides."""
    cards: dict[str, int] = {}
    for node in nodes:
        for card in node.cards:
            cards[card.model] = cards.get(card.model, 0) + 1
    pressure = dict.fromkeys(cards, 0.0)
    demands = [d for d in workload if d.count]
    for demand in demands:
        if not demand.models or demand.profile is not None:
            continue
        size = min(demand.share, MILLI)
        total = sum(cards.get(model, 0) for model in demand.models)
        if not total:
            continue
        load = demand.count * size / total / len(demands)
        for model in demand.models:
            if model in pressure:
                pressure[model] += load
    return {model: round(value, 6) for model, value in pressure.items()}


class MigScore:
    """The score's parts for one workload over the cards' geometries, memoised by card state."""

    def __init__(self, geometries: Mapping[str, Geometry], workload: Iterable[SliceDemand]):
        self.geometries = geometries
        workload = list(workload)
        self.weights = mix_weights(workload)
        self.shapes = typical_shapes(workload)
        self.groups = _shape_groups(self.shapes, geometries)
        self.klasses = sorted({shape[0] for shape in self.shapes}, key=str)
        self._usable: dict = {}

    def usable(self, st) -> dict:
        """Capacity (milli) of one card state that each demand class could still take, the classes that could
        take none left out (a card serves few of a constrained workload's classes)."""
        found = self._usable.get(st)
        if found is None:
            found = {}
            for klass in self.klasses:
                room = self._usable_now(st, klass)
                if room:
                    found[klass] = room
            self._usable[st] = found
        return found

    def changed(self, before: Mapping, old_cards, new_cards) -> dict:
        """Class capacities of a node once ``old_cards`` states become ``new_cards``."""
        after = dict(before)
        for st in old_cards:
            for klass, room in self.usable(st).items():
                after[klass] -= room
        for st in new_cards:
            for klass, room in self.usable(st).items():
                after[klass] = after.get(klass, 0.0) + room
        return after

    def _usable_now(self, st, klass) -> float:
        kind = st[0]
        if kind != "x" and klass[2] and st[1] not in klass[2]:
            return 0.0
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
        return self.changed({}, (), cards), sum(self.free_milli(st) for st in cards)

    def node_frag(self, cpu: int, usable: Mapping, idle: float) -> float:
        """FGD over the typical shapes: a shape that cannot run on the node strands all its idle capacity, one
        that can strands what its class cannot use. As ``idle - sum(weight * room)`` over the shapes that fit,
        with the shapes of one (class, count) sorted by CPU: a bisection per group.

        A slice shape's room is also what the node's CPU can run of it: three free half cards are worth one 4g
        slice to a node with 10 cores left when the shape needs 8 (FGD tests only whether one fits). Whole-card
        shapes keep FGD's test (limiting them as well lost 0.6 points of alloc@100 on openb default)."""
        total = idle
        groups = self.groups
        for klass, room in usable.items():
            for need, cpus, prefix, unit, weights in groups.get(klass, ()):
                if room < need:
                    continue
                top = bisect_right(cpus, cpu)
                runs = room // unit if unit else 0
                if runs <= 1:
                    total -= room * prefix[top]
                    continue
                # the shapes that need at most cpu/runs cores run as often as the cards allow, the others less
                enough = bisect_right(cpus, cpu / runs)
                total -= room * prefix[enough]
                for k in range(enough, top):
                    total -= weights[k] * min(room, (cpu // cpus[k]) * unit)
        return total


def _shape_groups(shapes, geometries: Mapping[str, Geometry]) -> dict:
    """Per class, per count: the capacity one shape needs, its shapes' CPU sorted, prefix weights, the capacity
    one demand of a slice class takes (0 for other classes) and each shape's weight."""
    groups: dict = {}
    for klass, count, cpu, _mem, weight in shapes:
        groups.setdefault((klass, count), []).append((cpu, weight))
    out: dict = {}
    for (klass, count), members in sorted(groups.items(), key=str):
        members.sort()
        prefix = [0.0]
        for _cpu, weight in members:
            prefix.append(prefix[-1] + weight)
        need = count * klass[1] if klass[0] != "slice" else 1
        unit = count * _slice_milli(klass, geometries) if klass[0] == "slice" else 0
        out.setdefault(klass, []).append((need, [cpu for cpu, _w in members], prefix, unit, [w for _cpu, w in members]))
    return out


def _slice_milli(klass, geometries: Mapping[str, Geometry]) -> float:
    """The capacity (milli) one instance of a slice class takes: its memory slices of the card."""
    for model in sorted(klass[2] or geometries):
        g = geometries.get(model)
        profile = g.profile(klass[1]) if g else None
        if profile is not None:
            return profile.memory_slices * MILLI / g.memory_slices
    return 0.0
