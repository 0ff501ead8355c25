"""MIG as the hardware does it: profile geometry, layout rules, the MIG fragmentation score and a geometry-true
placement engine. Pure Python, no Django (the catalog's geometry rows are turned into `Geometry` by the caller).

A MIG-capable card has ``compute_slices`` compute slices and ``memory_slices`` memory slices (H100 80GB: 7 and 8).
A GPU-instance profile takes ``compute`` compute slices and a run of memory slices at one of its allowed placements
``(start, size)``; creating an instance fails when its placement overlaps an occupied one (NVIDIA MIG User Guide,
"Supported MIG Profiles"; ``nvidia-smi mig -lgip`` / ``-lgipp``). A layout is valid when every instance sits at an
allowed placement of its profile, no two instances share a memory slice, the compute slices add up to at most the
card's, and no profile has more instances than its table allows (``+me`` profiles: one).

MIG fragmentation score (in the spirit of FGD, Weng et al., ATC'23). The workload's demand mix gives each demand
class ``c`` (a whole card, or one instance of profile ``p``) a popularity weight ``w_c`` (sum 1). For one card,
``usable_c`` is the capacity class ``c`` could still take from the card as it is now: for a profile, the memory
slices of the most instances of ``p`` that fit at once in the free slices (free compute slices and the profile's
instance limit included); for a whole card, the full card if it is empty and may change mode, else nothing. The
card's fragmentation is ``F = sum_c w_c * (free - usable_c)`` in milli-cards (``1000 / memory_slices`` per memory
slice): the free capacity the typical demand could not use. Among all valid placements of a demand the engine takes
the one with the smallest increase ``F(after) - F(before)`` of the card it touches, then the node left with the
least free card capacity, then the seeded node order, the lowest card index and the lowest start.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MILLI = 1000
WHOLE = "whole"

# Reasons, the same codes as scheduling.placement.
NO_MATCHING_SPEC = "no_matching_spec"
INSUFFICIENT_HEALTHY_CAPACITY = "insufficient_healthy_capacity"
CAPACITY_IN_USE = "capacity_in_use"
TOPOLOGY_CONSTRAINT = "topology_constraint"
FRAGMENTATION = "fragmentation"


# ---------------------------------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class Profile:
    name: str
    profile_id: int
    compute: int  # compute slices
    memory_slices: int
    memory_gb: int
    placements: tuple[tuple[int, int], ...]  # (start memory slice, size)
    max_instances: int

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(start for start, _size in self.placements)


@dataclass(frozen=True)
class Geometry:
    model: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[Profile, ...]
    source: str = ""

    def profile(self, name: str) -> Profile | None:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        return None

    @property
    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1


SOURCE = (
    "NVIDIA Multi-Instance GPU User Guide, 'Supported MIG Profiles' (docs.nvidia.com/datacenter/tesla/mig-user-guide,"
    " web edition r580, read 2026-12-01; PDF RN-08625-v2.0, March 2024); profile ids and placements as printed by "
    "nvidia-smi mig -lgip / -lgipp"
)


def _ampere_hopper(model: str, small: int, double: int, half: int, full: int, me: str = "+me") -> Geometry:
    """The 7-compute/8-memory-slice family (A100, H100, H200, B200): names follow each card's memory."""
    sizes = [
        (f"1g.{small}gb", 19, 1, 1, small, tuple((s, 1) for s in range(7)), 7),
        (f"1g.{small}gb{me}", 20, 1, 1, small, tuple((s, 1) for s in range(7)), 1),
        (f"1g.{double}gb", 15, 1, 2, double, tuple((s, 2) for s in (0, 2, 4, 6)), 4),
        (f"2g.{double}gb", 14, 2, 2, double, tuple((s, 2) for s in (0, 2, 4)), 3),
        (f"3g.{half}gb", 9, 3, 4, half, ((0, 4), (4, 4)), 2),
        (f"4g.{half}gb", 5, 4, 4, half, ((0, 4),), 1),
        (f"7g.{full}gb", 0, 7, 8, full, ((0, 8),), 1),
    ]
    return Geometry(model, 7, 8, tuple(Profile(*row) for row in sizes), SOURCE)


SEEDED: dict[str, Geometry] = {
    "A30 24GB": Geometry(
        "A30 24GB",
        4,
        4,
        (
            Profile("1g.6gb", 14, 1, 1, 6, ((0, 1), (1, 1), (2, 1), (3, 1)), 4),
            Profile("1g.6gb+me", 21, 1, 1, 6, ((0, 1), (1, 1), (2, 1), (3, 1)), 1),
            Profile("2g.12gb", 5, 2, 2, 12, ((0, 2), (2, 2)), 2),
            Profile("2g.12gb+me", 6, 2, 2, 12, ((0, 2), (2, 2)), 1),
            Profile("4g.24gb", 0, 4, 4, 24, ((0, 4),), 1),
        ),
        SOURCE,
    ),
    "A100 40GB": _ampere_hopper("A100 40GB", 5, 10, 20, 40),
    "A100 80GB": _ampere_hopper("A100 80GB", 10, 20, 40, 80),
    "H100 80GB": _ampere_hopper("H100 80GB", 10, 20, 40, 80),
    "H100 94GB": _ampere_hopper("H100 94GB", 12, 24, 47, 94),
    "H200 141GB": _ampere_hopper("H200 141GB", 18, 35, 71, 141),
    "B200 180GB": _ampere_hopper("B200 180GB", 23, 45, 90, 180),
}


def geometry_problems(geometry: Geometry) -> list[str]:
    """What makes a geometry impossible: placements outside the card, sizes that disagree with the profile,
    more compute than the card has, an instance limit the placements cannot reach."""
    problems = []
    if geometry.memory_slices < 1 or geometry.compute_slices < 1:
        problems.append("a card needs at least one compute and one memory slice")
    names = [profile.name for profile in geometry.profiles]
    if len(set(names)) != len(names):
        problems.append("profile names repeat")
    for profile in geometry.profiles:
        if not 1 <= profile.compute <= geometry.compute_slices:
            problems.append(f"{profile.name}: {profile.compute} compute slices, the card has {geometry.compute_slices}")
        if not profile.placements:
            problems.append(f"{profile.name}: no placement")
        for start, size in profile.placements:
            if size != profile.memory_slices:
                problems.append(
                    f"{profile.name}: placement at {start} has size {size}, the profile takes "
                    f"{profile.memory_slices} memory slices"
                )
            if start < 0 or start + size > geometry.memory_slices:
                problems.append(
                    f"{profile.name}: placement {start}+{size} is outside the card's "
                    f"{geometry.memory_slices} memory slices"
                )
        if profile.max_instances < 1:
            problems.append(f"{profile.name}: at most {profile.max_instances} instances")
        elif profile.max_instances > max_pack(geometry, profile, 0, 0, {}):
            problems.append(f"{profile.name}: {profile.max_instances} instances cannot fit on one card")
    return problems


def layout_problems(geometry: Geometry, instances: Iterable[tuple[str, int, int]]) -> list[str]:
    """Why a layout (profile name, start, size per GPU instance) could not exist on the card; empty when it can."""
    problems = []
    occupied = 0
    compute = 0
    counts: dict[str, int] = {}
    for name, start, size in instances:
        profile = geometry.profile(name)
        if profile is None:
            problems.append(f"{name} is not a profile of {geometry.model}")
            continue
        if (start, size) not in profile.placements:
            problems.append(
                f"{name} cannot start at memory slice {start} with size {size} (starts {_or_list(profile.starts)})"
            )
            continue
        mask = ((1 << size) - 1) << start
        if occupied & mask:
            problems.append(f"{name} at {start} overlaps memory slices {_ranges(occupied & mask)}")
        occupied |= mask
        compute += profile.compute
        counts[name] = counts.get(name, 0) + 1
        if counts[name] > profile.max_instances:
            problems.append(f"more than {profile.max_instances} {name}")
    if compute > geometry.compute_slices:
        problems.append(f"{compute} compute slices used, the card has {geometry.compute_slices}")
    return problems


def fits_somehow(geometry: Geometry, names: Sequence[str]) -> bool:
    """Whether some layout holds all these profiles at once (exhaustive, largest first): the milli-share model's
    layouts are checked with it."""
    profiles = []
    for name in names:
        profile = geometry.profile(name)
        if profile is None:
            return False
        profiles.append(profile)
    if sum(p.compute for p in profiles) > geometry.compute_slices:
        return False
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p.name] = counts.get(p.name, 0) + 1
        if counts[p.name] > p.max_instances:
            return False
    profiles.sort(key=lambda p: (-p.memory_slices, p.name))

    def search(k: int, occupied: int) -> bool:
        if k == len(profiles):
            return True
        for start, size in profiles[k].placements:
            mask = ((1 << size) - 1) << start
            if not occupied & mask and search(k + 1, occupied | mask):
                return True
        return False

    return search(0, 0)


def max_pack(geometry: Geometry, profile: Profile, occupied: int, compute_used: int, counts: Mapping[str, int]) -> int:
    """Most instances of ``profile`` that fit at once in the free slices. All placements of a profile have one
    size, so taking free placements in start order (earliest end first) is optimal."""
    n = 0
    taken = occupied
    for start, size in profile.placements:
        mask = ((1 << size) - 1) << start
        if not taken & mask:
            taken |= mask
            n += 1
    room = (geometry.compute_slices - compute_used) // profile.compute
    return max(0, min(n, room, profile.max_instances - counts.get(profile.name, 0)))


def free_starts(geometry: Geometry, profile: Profile, occupied: int, compute_used: int, counts) -> list[int]:
    if compute_used + profile.compute > geometry.compute_slices:
        return []
    if counts.get(profile.name, 0) >= profile.max_instances:
        return []
    return [start for start, size in profile.placements if not occupied & (((1 << size) - 1) << start)]


def _ranges(mask: int) -> str:
    """Memory slices of a mask as text: "1–3 and 6" (an en dash, as people write ranges)."""  # noqa: RUF002
    slices = [i for i in range(mask.bit_length()) if mask >> i & 1]
    runs: list[str] = []
    i = 0
    while i < len(slices):
        j = i
        while j + 1 < len(slices) and slices[j + 1] == slices[j] + 1:
            j += 1
        runs.append(str(slices[i]) if i == j else f"{slices[i]}–{slices[j]}")  # noqa: RUF001
        i = j + 1
    return _and_list(runs) or "none"


def _and_list(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


def _or_list(items: Iterable[int]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def create_commands(gpu: int, profile_id: int, start: int, *, mode_change: bool = False) -> list[list[str]]:
    """The host commands that create one GPU instance (and its default compute instance) at a placement; MIG mode
    first when the card is in whole mode (only ever on an empty card). `nvidia-smi mig -lgipp` lists a profile's
    placements; `-cgi <profile id>:<start>` asks for one (R525 and later drivers)."""
    commands = [["nvidia-smi", "-i", str(gpu), "-mig", "1"]] if mode_change else []
    commands.append(["nvidia-smi", "mig", "-i", str(gpu), "-cgi", f"{profile_id}:{start}", "-C"])
    commands.append(["nvidia-smi", "-L"])  # reads the new MIG device UUID back
    return commands


def destroy_commands(gpu: int, gi_id: int | None) -> list[list[str]]:
    """Destroy a GPU instance made for work that ended: its compute instances, then the GPU instance."""
    gi = "?" if gi_id is None else str(gi_id)
    return [
        ["nvidia-smi", "mig", "-i", str(gpu), "-gi", gi, "-dci"],
        ["nvidia-smi", "mig", "-i", str(gpu), "-dgi", "-gi", gi],
    ]


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
        cards = tuple(self.cards[i])
        cid = self._card_ids.get(cards)
        if cid is None:
            cid = self._card_ids[cards] = len(self._card_tuples)
            self._card_tuples.append(cards)
        return (self.cpu[i], self.mem[i], cid)

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
                where = self.where[old]
                del where[(i, j)]
                if not where:
                    del self.where[old]
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

    def fits(self, demand: SliceDemand) -> bool:
        return self._best(demand) is not None

    def release(self, binding: MigBinding) -> None:
        """Give a binding back: whole cards and shares free up (an emptied repartitionable card may change mode
        again), a created instance is destroyed, a pinned layout's instance becomes free."""
        i = self.node_index[binding.node]
        node = self.nodes[i]
        new_states = []
        for p in binding.placed:
            st = self.cards[i][p.card]
            card = node.cards[p.card]
            if p.instance is None:
                if card.geometry is None:
                    new = ("p", card.model, (st[2] if st[0] == "p" else 0) + p.milli)
                elif card.pinned or not self.repartition:
                    new = ("w", card.model)
                else:
                    new = ("m", card.model, 0, 0, ())
                new_states.append((p.card, new))
                continue
            inst = (p.instance.profile, p.instance.start, p.instance.size)
            if st[0] == "m":
                held = list(st[4])
                held.remove(inst)
                g = self.geometries[st[1]]
                new = ("m", st[1], _mask(held), st[3] - g.profile(inst[0]).compute, tuple(held))
            else:
                k = st[2].index(inst)
                new = ("s", st[1], st[2], (*st[3][:k], False, *st[3][k + 1 :]))
            new_states.append((p.card, new))
        self._commit(i, new_states, binding.cpu_milli, binding.memory_mib)

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
