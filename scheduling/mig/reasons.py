"""Why a MIG engine cannot place a demand now, with its numbers in MIG terms ("needs 3g.40gb; gpu 3 on node n7 has
free memory slices 1-3 and 6, no valid 3g placement (starts 0 or 4)": `fragmentation`). Pure Python."""

from __future__ import annotations

from scheduling.mig.geometry import Profile, _or_list, _ranges, free_starts
from scheduling.mig.model import CAPACITY_IN_USE, FRAGMENTATION, NO_MATCHING_SPEC, MigPending, SliceDemand
from scheduling.mig.states import profile_counts


def diagnose(engine, demand: SliceDemand) -> MigPending:
    """Why a demand cannot be placed now on the engine (a `MigEngine`), with its numbers in MIG terms."""
    if demand.needs:
        return _needs(engine, demand)
    if demand.count and not _exists(engine, demand):
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
    fragmented, placeable = _look_at_cards(engine, demand)
    if fragmented is not None:
        return _fragmentation(demand, *fragmented)
    if placeable:  # a card has a free placement: its node is short of CPU or memory
        return MigPending(
            demand.id,
            CAPACITY_IN_USE,
            f"needs {demand.label}; the cards with a free {demand.profile} placement are on nodes without "
            f"{demand.cpu_milli / 1000:g} cores and {demand.memory_mib / 1024:g} GiB left",
            {"cpu_milli": demand.cpu_milli, "memory_mib": demand.memory_mib},
        )
    pinned = engine.has_pinned
    return MigPending(
        demand.id,
        CAPACITY_IN_USE,
        f"needs {demand.label}; no MIG card has {'a free instance or ' if pinned else ''}room for one",
        {"profile": demand.profile},
    )


def _needs(engine, demand: SliceDemand) -> MigPending:
    """A demand that needs capabilities (a serving runtime's model file) of its node: none offers them, or those
    that do have no room now."""
    offering = sorted(node.name for node in engine.nodes if demand.needs <= node.capabilities)
    what = f"needs {demand.label} on a node with {demand.needs_label or ', '.join(sorted(demand.needs))}"
    if not offering:
        return MigPending(
            demand.id,
            NO_MATCHING_SPEC,
            f"{what}; no node of the inventory has it, so it cannot run here",
            {"dimension": "runtime", "needs": sorted(demand.needs), "nodes": 0},
        )
    return MigPending(
        demand.id,
        CAPACITY_IN_USE,
        f"{what}; the nodes with it ({', '.join(offering)}) have no room for it now",
        {"nodes": offering},
    )


def _exists(engine, demand: SliceDemand) -> bool:
    """Some card of the cluster is of the demand's models and, for a slice, has its profile (the inventory's cards
    do not change in an engine's life: remembered per models and profile)."""
    key = (demand.models, demand.profile)
    found = engine.exists.get(key)
    if found is None:
        found = engine.exists[key] = any(
            (not demand.models or c.model in demand.models)
            and (demand.profile is None or (c.geometry is not None and c.geometry.profile(demand.profile)))
            for node in engine.nodes
            for c in node.cards
        )
    return found


def _look_at_cards(engine, demand: SliceDemand):
    """Over the distinct repartitionable card states: the first card (by node name, then index) with enough free
    slices and compute but no valid placement, as (node, gpu, free mask, profile) or None; and whether any card
    has a free placement."""
    fragmented = None
    placeable = False
    for st, where in engine.where.items():
        if demand.models and st[1] not in demand.models:
            continue
        g = engine.geometries[st[1]]
        profile = g.profile(demand.profile)
        if profile is None:
            continue
        free_mask = g.full_mask & ~st[2]
        if free_starts(g, profile, st[2], st[3], profile_counts(st[4])):
            placeable = True
        elif free_mask.bit_count() >= profile.memory_slices and g.compute_slices - st[3] >= profile.compute:
            i, j = min(where)
            candidate = (engine.nodes[i].name, j, free_mask, profile)
            if fragmented is None or candidate[:2] < fragmented[:2]:
                fragmented = candidate
    return fragmented, placeable


def _fragmentation(demand: SliceDemand, node: str, gpu: int, free_mask: int, profile: Profile) -> MigPending:
    return MigPending(
        demand.id,
        FRAGMENTATION,
        f"needs {profile.name}; gpu {gpu} on node {node} has free memory slices {_ranges(free_mask)}, no "
        f"valid {profile.name.split('.')[0]} placement (starts {_or_list(profile.starts)})",
        {
            "node": node,
            "gpu": gpu,
            "free_memory_slices": [k for k in range(free_mask.bit_length()) if free_mask >> k & 1],
            "profile": profile.name,
            "starts": list(profile.starts),
            "size": profile.memory_slices,
        },
    )


def budget_spent(engine, demand: SliceDemand) -> MigPending:
    """A slice that only an empty card could take while the partition budget is spent: it waits for room on the
    partitioned cards, the empty ones stay for whole-card work."""
    return MigPending(
        demand.id,
        CAPACITY_IN_USE,
        f"needs {demand.label}; the cards that hold slices have no room for it, and {engine.partitioned} of the "
        f"MIG-capable cards hold slices already, the most the workload's whole-card demand leaves for slices "
        f"(partition budget {engine.partition_budget}): the empty cards stay for whole-card work",
        {"profile": demand.profile, "partitioned": engine.partitioned, "partition_budget": engine.partition_budget},
    )
