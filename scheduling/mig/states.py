"""A card as the MIG engine keeps it: a small hashable state tuple, so that node scores are memoised by state and
shared by every node in the same state. Pure Python.

  ("x",)                                        unusable (unhealthy), or taken whole
  ("p", model, free_milli)                      not MIG-capable: whole cards or time-sliced milli shares
  ("w", model)                                  MIG-capable, whole mode, idle, layout pinned: whole demands only
  ("m", model, occupied, compute, instances)    MIG-capable, repartitionable: only instances held by work count
                                                (idle ones are destroyed when a placement needs their room, see
                                                geometry.idle_in_the_way), so an empty card may also change mode
                                                and take a whole demand
  ("s", model, instances, busy)                 MIG-capable, pinned MIG layout: only its free instances are usable

``occupied`` is a bit mask of memory slices, ``compute`` the compute slices in use, ``instances`` sorted
(profile, start, size) triples.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduling.mig.geometry import Geometry, Profile, free_starts
from scheduling.mig.model import MILLI, Card, Placed, SliceDemand

TAKEN = ("x",)


def occupied_mask(instances) -> int:
    occupied = 0
    for _name, start, size in instances:
        occupied |= ((1 << size) - 1) << start
    return occupied


def profile_counts(instances) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, _start, _size in instances:
        counts[name] = counts.get(name, 0) + 1
    return counts


def card_state(card: Card, repartition: bool):
    """The state of a card as the inventory gives it; without ``repartition`` every MIG-capable card is pinned."""
    if not card.healthy:
        return TAKEN
    g = card.geometry
    if g is None:
        return ("p", card.model, MILLI - card.busy_milli)
    pinned = card.pinned or not repartition
    if not card.mig:
        if card.busy_milli:
            return TAKEN
        return ("w", card.model) if pinned else ("m", card.model, 0, 0, ())
    if pinned:
        instances = tuple(sorted((i.profile, i.start, i.size) for i in card.instances))
        busy = tuple(any(i.busy for i in card.instances if (i.profile, i.start, i.size) == inst) for inst in instances)
        return ("s", card.model, instances, busy)
    # An idle instance of a repartitionable card can be destroyed (by its GPU instance id): only the held ones, and
    # idle ones the node reported without an id, count.
    held = tuple(sorted((i.profile, i.start, i.size) for i in card.instances if i.busy or i.gi_id is None))
    return ("m", card.model, occupied_mask(held), sum(g.profile(n).compute for n, _s, _z in held), held)


def released_state(st, card: Card, p: Placed, repartition: bool, geometries: Mapping[str, Geometry]):
    """A card's state once what ``p`` holds on it is given back (an unusable card stays unusable)."""
    if st == TAKEN and not card.healthy:
        return TAKEN
    if p.instance is None:
        if card.geometry is None:
            return ("p", card.model, (st[2] if st[0] == "p" else 0) + p.milli)
        return ("w", card.model) if card.pinned or not repartition else ("m", card.model, 0, 0, ())
    inst = (p.instance.profile, p.instance.start, p.instance.size)
    if st[0] == "m":
        held = list(st[4])
        held.remove(inst)
        g = geometries[st[1]]
        return ("m", st[1], occupied_mask(held), st[3] - g.profile(inst[0]).compute, tuple(held))
    k = st[2].index(inst)
    return ("s", st[1], st[2], (*st[3][:k], False, *st[3][k + 1 :]))


def taken_state(st, milli: int):
    """A card's state once other work takes ``milli`` of it: a share of a plain card, else the whole card."""
    return ("p", st[1], st[2] - milli) if st[0] == "p" and st[2] > milli else TAKEN


def free_milli(st, geometries: Mapping[str, Geometry]) -> float:
    """Free capacity of a card in milli-cards (memory slices for MIG cards)."""
    kind = st[0]
    if kind == "p":
        return st[2]
    if kind == "w":
        return MILLI
    if kind == "m":
        g = geometries[st[1]]
        return (g.memory_slices - st[2].bit_count()) * MILLI / g.memory_slices
    if kind == "s":
        g = geometries[st[1]]
        free = sum(size for (_n, _s, size), busy in zip(st[2], st[3], strict=True) if not busy)
        return free * MILLI / g.memory_slices
    return 0


def partitioned(st) -> bool:
    """Whether a card state holds slices: a MIG layout with running instances, or a pinned MIG layout."""
    return st[0] == "s" or (st[0] == "m" and st[2] != 0)


def card_options(
    j: int, st, demand: SliceDemand, geometries: Mapping[str, Geometry], first_fit: bool, fresh: bool = True
) -> list:
    """Ways the demand can take card ``j``: (card index, start, new card state, milli taken, instance, create).
    ``fresh`` False: a slice may not partition an empty card (the partition budget is spent)."""
    kind = st[0]
    if kind == "x" or (demand.models and st[1] not in demand.models):
        return []
    if demand.profile is None:
        return _whole_options(j, st, demand.share)
    if kind not in ("m", "s"):
        return []
    g = geometries[st[1]]
    profile = g.profile(demand.profile)
    if profile is None:
        return []
    if kind == "m":
        if not fresh and st[2] == 0:
            return []
        return _new_instance_options(j, st, g, profile, first_fit)
    return _free_instance_options(j, st, g, profile, first_fit)


def _whole_options(j: int, st, need: int) -> list:
    kind = st[0]
    if kind == "p" and st[2] >= need:
        return [(j, 0, ("p", st[1], st[2] - need) if st[2] > need else TAKEN, need, None, False)]
    if need >= MILLI and (kind == "w" or (kind == "m" and st[2] == 0)):
        return [(j, 0, TAKEN, MILLI, None, False)]
    return []


def _new_instance_options(j: int, st, g: Geometry, profile: Profile, first_fit: bool) -> list:
    """Repartitioning: an instance created at each free valid start (the lowest only for first-fit)."""
    unit = MILLI // g.memory_slices
    size = profile.memory_slices
    occupied, compute, held = st[2], st[3], st[4]
    starts = free_starts(g, profile, occupied, compute, profile_counts(held))
    out = []
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
    return out


def _free_instance_options(j: int, st, g: Geometry, profile: Profile, first_fit: bool) -> list:
    """A pinned layout: each free instance of the profile (the first only for first-fit)."""
    unit = MILLI // g.memory_slices
    out = []
    for k, ((name, start, size), busy) in enumerate(zip(st[2], st[3], strict=True)):
        if busy or name != profile.name:
            continue
        new = ("s", st[1], st[2], (*st[3][:k], True, *st[3][k + 1 :]))
        out.append((j, start, new, size * unit, (name, start, size), False))
        if first_fit:
            break
    return out
