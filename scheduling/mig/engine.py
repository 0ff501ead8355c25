"""The geometry-true placement engine over MIG-capable and other cards (see scheduling/mig/__init__.py for the
fragmentation score). Pure Python."""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduling.mig.geometry import Geometry, _or_list, _ranges, free_starts, max_pack
from scheduling.placement import smallest_victim_set

MILLI = 1000
WHOLE = "whole"

# Reasons, the same codes as scheduling.placement.
NO_MATCHING_SPEC = "no_matching_spec"
INSUFFICIENT_HEALTHY_CAPACITY = "insufficient_healthy_capacity"
CAPACITY_IN_USE = "capacity_in_use"
TOPOLOGY_CONSTRAINT = "topology_constraint"
FRAGMENTATION = "fragmentation"


# ---------------------------------------------------------------------------------------------------- inventory


@dataclass(frozen=True)
class Instance:
    """A GPU instance on a card: profile, placement, the ids the driver gave it, and whether work holds it."""

    profile: str
    start: int
    size: int
    gi_id: int | None = None
    ci_id: int | None = None
    uuid: str = ""
    busy: bool = False


@dataclass(frozen=True)
class Card:
    """One accelerator. ``geometry`` None: not MIG-capable (whole cards or time-sliced milli shares). A MIG-capable
    card is in ``mig`` mode with ``instances`` or in whole mode; ``pinned`` freezes its layout (no instance created
    or destroyed, no mode change)."""

    index: int
    model: str
    geometry: Geometry | None = None
    mig: bool = False
    instances: tuple[Instance, ...] = ()
    pinned: bool = False
    healthy: bool = True
    busy_milli: int = 0  # whole mode / not MIG-capable: milli in use


@dataclass(frozen=True)
class MigNode:
    name: str
    cpu_milli: int
    memory_mib: int
    cards: tuple[Card, ...] = ()
    schedulable: bool = True


@dataclass(frozen=True)
class SliceDemand:
    """One node, ``count`` cards (whole: ``profile`` None, ``share`` 1000 or a time-sliced milli share on cards
    that are not MIG-capable) or one GPU instance of ``profile`` on a MIG-capable card of ``models``."""

    id: str
    count: int = 1
    profile: str | None = None
    share: int = MILLI
    models: frozenset = frozenset()
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def klass(self):
        if self.count == 0:
            return None
        return (
            ("slice", self.profile)
            if self.profile
            else ((WHOLE, MILLI) if self.share >= MILLI else ("share", self.share))
        )

    @property
    def label(self) -> str:
        what = "/".join(sorted(self.models)) or "any"
        if self.profile:
            return f"{self.profile} on {what}"
        return f"{self.count}×{'' if self.share >= MILLI else f'{self.share / MILLI:g} of '}{what}"  # noqa: RUF001


@dataclass(frozen=True)
class Placed:
    """What a binding takes on one card: the whole card (``instance`` None, ``milli``), or a GPU instance.
    ``create``: repartitioning creates the instance (a provisioning step); ``mode``: the card changes mode first
    ("mig" or "whole")."""

    card: int
    milli: int
    instance: Instance | None = None
    create: bool = False
    mode: str | None = None


@dataclass(frozen=True)
class MigBinding:
    demand_id: str
    node: str
    placed: tuple[Placed, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True)
class Holding:
    """Running work as preemption sees it: what it holds on each card of its node, its CPU and memory, and what
    victims are ordered by."""

    id: str
    node: str
    placed: tuple[Placed, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    started_at: float = 0.0


@dataclass(frozen=True)
class MigPreemptionPlan:
    feasible: bool
    node: str | None = None
    victims: tuple[str, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class MigPending:
    demand_id: str
    reason: str
    message: str
    numbers: Mapping[str, object] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- card states

# A card's state is a small hashable tuple; node scores are memoised by the node's state, shared by all its nodes:
#   ("x",)                                        unusable (unhealthy), or taken whole
#   ("p", model, free_milli)                      not MIG-capable: whole cards or time-sliced milli shares
#   ("w", model)                                  MIG-capable, whole mode, idle, layout pinned: whole demands only
#   ("m", model, occupied, compute, instances)    MIG-capable, repartitionable: only instances held by work exist
#                                                 (idle ones are destroyed on release), so an empty card may also
#                                                 change mode and take a whole demand
#   ("s", model, instances, busy)                 MIG-capable, pinned MIG layout: only its free instances are usable


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


def _mask(instances) -> int:
    occupied = 0
    for _name, start, size in instances:
        occupied |= ((1 << size) - 1) << start
    return occupied


def _counts(instances) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, _start, _size in instances:
        counts[name] = counts.get(name, 0) + 1
    return counts


class MigEngine:
    """Geometry-true placement over MIG-capable and other cards, with CPU and memory per node.

    ``policy`` "frag" (the MIG fragmentation score) or "first-fit" (first node in inventory order, first card,
    lowest valid start). ``repartition`` False treats every MIG-capable card as pinned (no instance created or
    destroyed, no mode change). Demands are placed one at a time; ``release`` gives a binding back (an instance of a
    repartitionable card is destroyed, a pinned one becomes free)."""

    def __init__(
        self,
        nodes: Sequence[MigNode],
        *,
        policy: str = "frag",
        repartition: bool = True,
        workload: Iterable[SliceDemand] = (),
        seed: int = 0,
    ):
        if policy not in ("frag", "first-fit"):
            raise ValueError(f"unknown MIG policy {policy!r}; choose frag or first-fit")
        self.policy, self.repartition = policy, repartition
        self.first_fit = policy == "first-fit"
        self.nodes = list(nodes)
        self.node_index = {node.name: i for i, node in enumerate(self.nodes)}
        self.geometries: dict[str, Geometry] = {}
        for node in self.nodes:
            for card in node.cards:
                if card.geometry is not None:
                    known = self.geometries.setdefault(card.model, card.geometry)
                    if known != card.geometry:
                        raise ValueError(f"two geometries for model {card.model}")
        workload = list(workload)
        self.weights = mix_weights(workload)
        self.shapes = typical_shapes(workload)
        groups: dict = {}
        for klass, count, cpu, _mem, weight in self.shapes:
            groups.setdefault((klass, count), []).append((cpu, weight))
        self._groups = []
        for (klass, count), members in sorted(groups.items(), key=str):
            members.sort()
            prefix = [0.0]
            for _cpu, weight in members:
                prefix.append(prefix[-1] + weight)
            need = count * klass[1] if klass[0] != "slice" else 1
            self._groups.append((klass, need, [cpu for cpu, _w in members], prefix))
        self._klasses = sorted({shape[0] for shape in self.shapes}, key=str)
        self._usable: dict = {}
        order = list(range(len(self.nodes)))
        if not self.first_fit:
            random.Random(seed).shuffle(order)
        self.rank = [0] * len(self.nodes)
        for position, i in enumerate(order):
            self.rank[i] = position
        self.cpu = [node.cpu_milli for node in self.nodes]
        self.mem = [node.memory_mib for node in self.nodes]
        self.cards = [[self._card_state(card) for card in node.cards] for node in self.nodes]
        self.modes = [[("mig" if card.mig else "whole") for card in node.cards] for node in self.nodes]
        self.known = [[{(i.start, i.size): i for i in card.instances} for card in node.cards] for node in self.nodes]
        self._card_ids: dict = {}
        self._card_tuples: list = []
        self._aggregates: dict = {}
        self._option_memo: dict = {}
        self.node_states = [self._node_state(i) for i in range(len(self.nodes))]
        self.version = [0] * len(self.nodes)
        self.changed: list[int] = []
        self._heaps: dict = {}
        self._card_frag: dict = {}
        # Where each MIG card state is (schedulable nodes): the pending reasons look at distinct states, not cards.
        self.where: dict = {}
        for i, node in enumerate(self.nodes):
            if node.schedulable:
                for j, st in enumerate(self.cards[i]):
                    if st[0] == "m":
                        self.where.setdefault(st, {})[(i, j)] = None

    # -- states -------------------------------------------------------------------------------------------------

    def _card_state(self, card: Card):
        if not card.healthy:
            return ("x",)
        g = card.geometry
        if g is None:
            return ("p", card.model, MILLI - card.busy_milli)
        pinned = card.pinned or not self.repartition
        if not card.mig:
            if card.busy_milli:
                return ("x",)
            return ("w", card.model) if pinned else ("m", card.model, 0, 0, ())
        if pinned:
            instances = tuple(sorted((i.profile, i.start, i.size) for i in card.instances))
            busy = tuple(
                any(i.busy for i in card.instances if (i.profile, i.start, i.size) == inst) for inst in instances
            )
            return ("s", card.model, instances, busy)
        # An idle instance of a repartitionable card can be destroyed: only the held ones count.
        held = tuple(sorted((i.profile, i.start, i.size) for i in card.instances if i.busy))
        return ("m", card.model, _mask(held), sum(g.profile(n).compute for n, _s, _z in held), held)

    def _node_state(self, i: int):
        """(cpu, memory, id of the card tuple): the card tuple is interned once per change, so the per-shape memos
        hash three ints."""
        return (self.cpu[i], self.mem[i], self._intern(tuple(self.cards[i])))

    def _intern(self, cards: tuple) -> int:
        cid = self._card_ids.get(cards)
        if cid is None:
            cid = self._card_ids[cards] = len(self._card_tuples)
            self._card_tuples.append(cards)
        return cid

    # -- the fragmentation score of one card --------------------------------------------------------------------

    def frag(self, st) -> float:
        """F of one card state (see the module docstring), memoised."""
        cached = self._card_frag.get(st)
        if cached is not None:
            return cached
        kind = st[0]
        total = 0.0
        if kind == "p":
            free = st[2]
            for klass, w in self.weights.items():
                usable = 0 if klass[0] == "slice" else (free // klass[1]) * klass[1]
                total += w * (free - usable)
        elif kind == "w":
            for klass, w in self.weights.items():
                total += w * (0 if klass[0] == WHOLE else MILLI)
        elif kind == "m":
            g = self.geometries[st[1]]
            occupied, compute, counts = st[2], st[3], _counts(st[4])
            unit = MILLI / g.memory_slices
            free = (g.memory_slices - occupied.bit_count()) * unit
            for klass, w in self.weights.items():
                if klass[0] == "slice":
                    profile = g.profile(klass[1])
                    usable = (
                        0
                        if profile is None
                        else max_pack(g, profile, occupied, compute, counts) * profile.memory_slices * unit
                    )
                elif klass[0] == WHOLE:
                    usable = MILLI if occupied == 0 else 0
                else:
                    usable = 0
                total += w * (free - usable)
        elif kind == "s":
            g = self.geometries[st[1]]
            unit = MILLI / g.memory_slices
            free_by_profile: dict[str, float] = {}
            for (name, _start, size), busy in zip(st[2], st[3], strict=True):
                if not busy:
                    free_by_profile[name] = free_by_profile.get(name, 0) + size * unit
            free = sum(free_by_profile.values())
            for klass, w in self.weights.items():
                usable = free_by_profile.get(klass[1], 0) if klass[0] == "slice" else 0
                total += w * (free - usable)
        self._card_frag[st] = total
        return total

    def usable(self, st, klass) -> float:
        """Capacity (milli) of one card state that demand class ``klass`` could still take (module docstring)."""
        key = (st, klass)
        cached = self._usable.get(key)
        if cached is not None:
            return cached
        kind, value = st[0], 0.0
        if kind == "p":
            value = 0 if klass[0] == "slice" else (st[2] // klass[1]) * klass[1]
        elif kind == "w":
            value = MILLI if klass[0] == WHOLE else 0
        elif kind == "m":
            if klass[0] == WHOLE:
                value = MILLI if st[2] == 0 else 0
            elif klass[0] == "slice":
                g = self.geometries[st[1]]
                profile = g.profile(klass[1])
                if profile is not None:
                    n = max_pack(g, profile, st[2], st[3], _counts(st[4]))
                    value = n * profile.memory_slices * MILLI / g.memory_slices
        elif kind == "s" and klass[0] == "slice":
            g = self.geometries[st[1]]
            value = (
                sum(size for (name, _s, size), busy in zip(st[2], st[3], strict=True) if not busy and name == klass[1])
                * MILLI
                / g.memory_slices
            )
        self._usable[key] = value
        return value

    def node_frag(self, cpu: int, mem: int, usable: Mapping, idle: float) -> float:
        """FGD over the typical shapes: a shape that cannot run on the node strands all its idle capacity, one
        that can strands what its class cannot use. As ``idle - sum(weight * room)`` over the shapes that fit,
        with the shapes of one (class, count) sorted by CPU: a bisection per group."""
        total = idle
        for klass, need, cpus, prefix in self._groups:
            room = usable.get(klass, 0.0)
            if room >= need:
                total -= room * prefix[bisect_right(cpus, cpu)]
        return total

    def free_milli(self, st) -> float:
        kind = st[0]
        if kind == "p":
            return st[2]
        if kind == "w":
            return MILLI
        if kind == "m":
            g = self.geometries[st[1]]
            return (g.memory_slices - st[2].bit_count()) * MILLI / g.memory_slices
        if kind == "s":
            g = self.geometries[st[1]]
            free = sum(size for (_n, _s, size), busy in zip(st[2], st[3], strict=True) if not busy)
            return free * MILLI / g.memory_slices
        return 0

    # -- evaluation of one node state -----------------------------------------------------------------------------

    def _options(self, cards: tuple, demand: SliceDemand):
        """Per usable card and placement: (card index, start, new card state, milli taken, instance, create)."""
        out = []
        first_fit = self.first_fit
        for j, st in enumerate(cards):
            kind = st[0]
            if kind == "x" or (demand.models and st[1] not in demand.models):
                continue
            if demand.profile is None:
                need = demand.share
                if kind == "p" and st[2] >= need:
                    out.append((j, 0, ("p", st[1], st[2] - need) if st[2] > need else ("x",), need, None, False))
                elif need >= MILLI and (kind == "w" or (kind == "m" and st[2] == 0)):
                    out.append((j, 0, ("x",), MILLI, None, False))
                continue
            if kind not in ("m", "s"):
                continue
            g = self.geometries[st[1]]
            profile = g.profile(demand.profile)
            if profile is None:
                continue
            unit = MILLI // g.memory_slices
            size = profile.memory_slices
            if kind == "m":
                occupied, compute, held = st[2], st[3], st[4]
                starts = free_starts(g, profile, occupied, compute, _counts(held))
                for start in starts[:1] if first_fit else starts:
                    instance = (profile.name, start, size)
                    new = (
                        "m",
                        st[1],
                        occupied | (((1 << size) - 1) << start),
                        compute + profile.compute,
                        tuple(sorted((*held, instance))),
                    )
                    out.append((j, start, new, size * unit, instance, True))
            else:
                for k, ((name, start, size), busy) in enumerate(zip(st[2], st[3], strict=True)):
                    if busy or name != profile.name:
                        continue
                    new = ("s", st[1], st[2], (*st[3][:k], True, *st[3][k + 1 :]))
                    out.append((j, start, new, size * unit, (name, start, size), False))
                    if first_fit:
                        break
        return out

    def _aggregate(self, cid: int):
        """Per card tuple: usable capacity per demand class and idle capacity, summed over the cards."""
        found = self._aggregates.get(cid)
        if found is None:
            cards = self._card_tuples[cid]
            usable, klasses = self.usable, self._klasses
            found = self._aggregates[cid] = (
                {k: sum(usable(st, k) for st in cards) for k in klasses},
                sum(self.free_milli(st) for st in cards),
            )
        return found

    def _scored_options(self, cid: int, demand: SliceDemand):
        """The demand's options on a card tuple with the class capacities each leaves, cached per card tuple and
        device part of the demand (the CPU and memory parts only change the bisection)."""
        key = (cid, demand.count, demand.profile, demand.share, demand.models)
        found = self._option_memo.get(key, _MISSING)
        if found is not _MISSING:
            return found
        cards = self._card_tuples[cid]
        options = self._options(cards, demand)
        if not options:
            self._option_memo[key] = None
            return None
        if self.first_fit:
            options.sort(key=lambda o: (o[0], o[1]))
            single = demand.profile is not None and demand.count == 1
            chosen = options[:1] if single else _distinct_cards(options, demand.count)
            found = None if chosen is None else tuple((o[0], o[2], o[3], o[4], o[5]) for o in chosen)
            self._option_memo[key] = found
            return found
        before, idle = self._aggregate(cid)
        usable, free, klasses = self.usable, self.free_milli, self._klasses
        scored = []
        seen: dict = {}
        for option in options:
            j, new = option[0], option[2]
            old = cards[j]
            effect = seen.get((old, new))
            if effect is None:
                effect = seen[(old, new)] = (
                    {k: before[k] - usable(old, k) + usable(new, k) for k in klasses},
                    idle - free(old) + free(new),
                )
            scored.append((j, option[1], option, effect))
        self._option_memo[key] = found = (before, idle, scored)
        return found

    def _evaluate(self, state, demand: SliceDemand):
        """(score, choices) of the best way to run the demand on a node in this state, or None; choices are
        (card index, new card state, milli, instance, create) per card taken."""
        cpu, mem, cid = state
        if demand.cpu_milli > cpu or demand.memory_mib > mem:
            return None
        if demand.count == 0:
            if self.first_fit:
                return ((), ())
            return ((self._aggregate(cid)[1],), ())  # CPU only: nodes with idle cards last
        found = self._scored_options(cid, demand)
        if found is None:
            return None
        if self.first_fit:
            return ((), found)
        before, idle, scored = found
        new_cpu, new_mem = cpu - demand.cpu_milli, mem - demand.memory_mib
        node_frag = self.node_frag
        f_before = node_frag(cpu, mem, before, idle)
        if demand.profile is not None and demand.count == 1:
            best = None
            for j, start, option, (after, left) in scored:
                key = (round(node_frag(new_cpu, new_mem, after, left) - f_before, 6), left, j, start)
                if best is None or key < best[0]:
                    best = (key, option)
            key, o = best
            return (key[:2], ((o[0], o[2], o[3], o[4], o[5]),))
        ranked = sorted(
            (round(node_frag(cpu, mem, after, left) - f_before, 6), j, start, option)
            for j, start, option, (after, left) in scored
        )
        chosen = _distinct_cards([r[3] for r in ranked], demand.count)
        if chosen is None:
            return None
        cards = self._card_tuples[cid]
        usable, free = self.usable, self.free_milli
        after = {k: before[k] + sum(usable(o[2], k) - usable(cards[o[0]], k) for o in chosen) for k in self._klasses}
        left = idle + sum(free(o[2]) - free(cards[o[0]]) for o in chosen)
        delta = round(node_frag(new_cpu, new_mem, after, left) - f_before, 6)
        return ((delta, left), tuple((o[0], o[2], o[3], o[4], o[5]) for o in chosen))

    # -- the index: per demand shape a lazy heap of node scores, memoised by node state --------------------------

    def _best(self, demand: SliceDemand):
        key = (demand.count, demand.profile, demand.share, demand.models, demand.cpu_milli, demand.memory_mib)
        entry = self._heaps.get(key)
        if entry is None:
            entry = self._heaps[key] = [[], None, {}]
        heap, seen, memo = entry
        state, version, rank, nodes = self.node_states, self.version, self.rank, self.nodes
        evaluate = self._evaluate
        if seen is None:
            todo: Iterable[int] = range(len(nodes))
        else:
            todo = set(self.changed[seen:])
        entry[1] = len(self.changed)
        fresh = []
        for i in todo:
            if not nodes[i].schedulable:
                continue
            st = state[i]
            result = memo.get(st, _MISSING)
            if result is _MISSING:
                result = memo[st] = evaluate(st, demand)
            if result is not None:
                fresh.append(((*result[0], rank[i]), i, version[i], result[1]))
        if seen is None:
            heap.extend(fresh)
            heapq.heapify(heap)
        else:
            for item in fresh:
                heapq.heappush(heap, item)
        while heap:
            _key, i, ver, choices = heap[0]
            if ver == version[i]:
                return i, choices
            heapq.heappop(heap)
        return None

    # -- public API -----------------------------------------------------------------------------------------------

    def place_one(self, demand: SliceDemand) -> MigBinding | MigPending:
        found = self._best(demand)
        if found is None:
            return self.diagnose(demand)
        i, choices = found
        placed = []
        for j, _new, milli, instance, create in choices:
            mode = None
            if instance is not None and self.modes[i][j] == "whole":
                mode = "mig"
            elif instance is None and self.nodes[i].cards[j].geometry is not None and self.modes[i][j] == "mig":
                mode = "whole"
            if instance is None:
                placed.append(Placed(j, milli, None, False, mode))
            else:
                inst = Instance(*instance, busy=True)
                if not create:
                    known = self.known[i][j].get((inst.start, inst.size))
                    if known is not None:
                        inst = Instance(
                            known.profile, known.start, known.size, known.gi_id, known.ci_id, known.uuid, True
                        )
                placed.append(Placed(j, milli, inst, create, mode))
        self._commit(i, [(c[0], c[1]) for c in choices], -demand.cpu_milli, -demand.memory_mib, placed)
        return MigBinding(demand.id, self.nodes[i].name, tuple(placed), demand.cpu_milli, demand.memory_mib)

    def _commit(self, i: int, new_states, cpu: int, mem: int, placed=()):
        cards = self.cards[i] = list(self.cards[i])
        schedulable = self.nodes[i].schedulable
        for j, st in new_states:
            old = cards[j]
            cards[j] = st
            if schedulable and old[0] == "m":
                self._unlocate(old, i, j)
            if schedulable and st[0] == "m":
                self.where.setdefault(st, {})[(i, j)] = None
        for p in placed:
            if p.mode:
                self.modes[i][p.card] = p.mode
        self.cpu[i] += cpu
        self.mem[i] += mem
        self.node_states[i] = self._node_state(i)
        self.version[i] += 1
        self.changed.append(i)

    def close_node(self, name: str) -> None:
        """No new work on this node from now on (as if cordoned); its cards leave the pending reasons too."""
        i = self.node_index[name]
        if not self.nodes[i].schedulable:
            return
        for j, st in enumerate(self.cards[i]):
            if st[0] == "m":
                self._unlocate(st, i, j)
        self.nodes[i] = replace(self.nodes[i], schedulable=False)
        self.version[i] += 1
        self.changed.append(i)

    def _unlocate(self, st, i: int, j: int) -> None:
        where = self.where[st]
        del where[(i, j)]
        if not where:
            del self.where[st]

    def fits(self, demand: SliceDemand) -> bool:
        return self._best(demand) is not None

    def release(self, binding: MigBinding) -> None:
        """Give a binding back: whole cards and shares free up (an emptied repartitionable card may change mode
        again), a created instance is destroyed, a pinned layout's instance becomes free."""
        i = self.node_index[binding.node]
        cards = list(self.cards[i])
        for p in binding.placed:
            cards[p.card] = self._released(cards[p.card], self.nodes[i].cards[p.card], p)
        self._commit(i, [(p.card, cards[p.card]) for p in binding.placed], binding.cpu_milli, binding.memory_mib)

    def _released(self, st, card: Card, p: Placed):
        """A card's state once what ``p`` holds on it is given back."""
        if p.instance is None:
            if card.geometry is None:
                return ("p", card.model, (st[2] if st[0] == "p" else 0) + p.milli)
            return ("w", card.model) if card.pinned or not self.repartition else ("m", card.model, 0, 0, ())
        inst = (p.instance.profile, p.instance.start, p.instance.size)
        if st[0] == "m":
            held = list(st[4])
            held.remove(inst)
            g = self.geometries[st[1]]
            return ("m", st[1], _mask(held), st[3] - g.profile(inst[0]).compute, tuple(held))
        k = st[2].index(inst)
        return ("s", st[1], st[2], (*st[3][:k], False, *st[3][k + 1 :]))

    def take(self, node: str, devices, cpu_milli: int, memory_mib: int) -> None:
        """What another engine bound on this node (the cycle's milli-share engine): its CPU and memory, a MIG-capable
        card it put work on (whole mode) is taken, a share of another card is used."""
        i = self.node_index[node]
        new_states = []
        for j, milli in devices:
            st = self.cards[i][j]
            used = st[0] == "p" and st[2] > milli
            new_states.append((j, ("p", st[1], st[2] - milli) if used else ("x",)))
        self._commit(i, new_states, -cpu_milli, -memory_mib)

    def plan_preemption(self, demand: SliceDemand, candidates: Iterable[Holding], budget: int = 200_000):
        """The smallest set of the candidates (running work the caller may evict for this demand) on one node
        whose release leaves a valid placement for the demand: the freed memory slices must hold one of the
        profile's placements (or the emptied card may change mode), with CPU and memory on the node. Victims as
        `scheduling.placement.smallest_victim_set` orders them (fewest, lowest priorities, youngest)."""
        if self.fits(demand):
            return MigPreemptionPlan(True, message="fits without preemption")
        by_node: dict[int, list[Holding]] = {}
        for holding in candidates:
            by_node.setdefault(self.node_index[holding.node], []).append(holding)
        best = smallest_victim_set(by_node, lambda i, subset: self._fits_without(i, subset, demand), budget)
        if best is None:
            return MigPreemptionPlan(
                False, message=f"needs {demand.label}; no set of preemptible work frees a valid placement on one node"
            )
        _key, i, subset = best
        ids = tuple(h.id for h in subset)
        name = self.nodes[i].name
        return MigPreemptionPlan(True, name, ids, f"evict {len(ids)} allocation(s) on {name}: {', '.join(ids)}")

    def _fits_without(self, i: int, subset: Sequence[Holding], demand: SliceDemand) -> bool:
        """Whether the demand has a valid placement on node ``i`` once the subset is released (nothing changes)."""
        if not self.nodes[i].schedulable:
            return False
        cards = list(self.cards[i])
        cpu, mem = self.cpu[i], self.mem[i]
        for holding in subset:
            for p in holding.placed:
                cards[p.card] = self._released(cards[p.card], self.nodes[i].cards[p.card], p)
            cpu, mem = cpu + holding.cpu_milli, mem + holding.memory_mib
        return self._evaluate((cpu, mem, self._intern(tuple(cards))), demand) is not None

    def layouts(self):
        """Every MIG-mode card's layout: (node, card index, geometry, [(profile, start, size)]) — the instances
        held by work, and for pinned layouts their idle instances too."""
        for i, node in enumerate(self.nodes):
            for j, st in enumerate(self.cards[i]):
                if st[0] == "m":
                    yield node.name, j, self.geometries[st[1]], list(st[4])
                elif st[0] == "s":
                    yield node.name, j, self.geometries[st[1]], list(st[2])

    # -- reasons ----------------------------------------------------------------------------------------------------

    def diagnose(self, demand: SliceDemand) -> MigPending:
        """Why a demand cannot be placed now, with its numbers in MIG terms."""
        if demand.count and not any(
            (not demand.models or c.model in demand.models)
            and (demand.profile is None or (c.geometry is not None and c.geometry.profile(demand.profile)))
            for node in self.nodes
            for c in node.cards
        ):
            kind = f"device with {demand.profile} instances" if demand.profile else "device"
            return MigPending(
                demand.id,
                NO_MATCHING_SPEC,
                f"needs {demand.label}; no such {kind} exists in the cluster",
                {"needed": demand.count, "devices": 0},
            )
        if demand.profile is None:
            return MigPending(
                demand.id,
                CAPACITY_IN_USE,
                f"needs {demand.label}; no node has {demand.count} free whole-mode or empty MIG cards with "
                f"{demand.cpu_milli / 1000:g} cores and {demand.memory_mib / 1024:g} GiB left",
                {"needed": demand.count, "cpu_milli": demand.cpu_milli, "memory_mib": demand.memory_mib},
            )
        fragmented = None  # a card with enough free slices and compute but no valid placement
        placeable = False  # a card with a free placement: the node is short of CPU or memory
        for st, where in self.where.items():
            if demand.models and st[1] not in demand.models:
                continue
            g = self.geometries[st[1]]
            profile = g.profile(demand.profile)
            if profile is None:
                continue
            free_mask = g.full_mask & ~st[2]
            if free_starts(g, profile, st[2], st[3], _counts(st[4])):
                placeable = True
            elif free_mask.bit_count() >= profile.memory_slices and g.compute_slices - st[3] >= profile.compute:
                i, j = min(where)
                candidate = (self.nodes[i].name, j, free_mask, profile)
                if fragmented is None or candidate[:2] < fragmented[:2]:
                    fragmented = candidate
        short_of_cpu = placeable
        if fragmented is not None:
            name, j, free_mask, profile = fragmented
            return MigPending(
                demand.id,
                FRAGMENTATION,
                f"needs {profile.name}; gpu {j} on node {name} has free memory slices {_ranges(free_mask)}, no "
                f"valid {profile.name.split('.')[0]} placement (starts {_or_list(profile.starts)})",
                {
                    "node": name,
                    "gpu": j,
                    "free_memory_slices": [k for k in range(free_mask.bit_length()) if free_mask >> k & 1],
                    "profile": profile.name,
                    "starts": list(profile.starts),
                    "size": profile.memory_slices,
                },
            )
        if short_of_cpu:
            return MigPending(
                demand.id,
                CAPACITY_IN_USE,
                f"needs {demand.label}; the cards with a free {demand.profile} placement are on nodes without "
                f"{demand.cpu_milli / 1000:g} cores and {demand.memory_mib / 1024:g} GiB left",
                {"cpu_milli": demand.cpu_milli, "memory_mib": demand.memory_mib},
            )
        pinned = any(st[0] == "s" for cards in self.cards for st in cards)
        return MigPending(
            demand.id,
            CAPACITY_IN_USE,
            f"needs {demand.label}; no MIG card has {'a free instance or ' if pinned else ''}room for one",
            {"profile": demand.profile},
        )


def _distinct_cards(options, count: int):
    chosen, used = [], set()
    for option in options:
        if option[0] not in used:
            used.add(option[0])
            chosen.append(option)
            if len(chosen) == count:
                return chosen
    return None


_MISSING = object()
