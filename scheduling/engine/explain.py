"""Explaining: why a demand the engine could not place waits, in words and numbers (`Pending`).

Cluster-wide counts come from the engine's incremental aggregates (devices, healthy devices and a histogram of
free milli per model), so a reason costs what changed, not the whole fleet. An `Explainer` reads its engine's
state and never writes it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from scheduling.engine.model import (
    CAPACITY_IN_USE,
    FRAGMENTATION,
    HEALTHY,
    INSUFFICIENT_HEALTHY_CAPACITY,
    TOPOLOGY_CONSTRAINT,
    Demand,
    Pending,
)
from scheduling.engine.words import cards_text, cores_text, memory_text, names_text


class Explainer:
    """Why demands wait on one engine. Its topology counts follow the engine's change list; the smallest share a
    slice profile takes depends on the inventory alone and is shared with the explainers of the engine's forks.

    ``engine`` is the `PlacementEngine` (place.py) it reads; not imported here, since place.py imports this module
    and the modules of the engine import one another in one direction only."""

    def __init__(self, engine, profile_shares: dict | None = None):
        # A weak reference: the engine holds its explainer, and an engine dropped (a fork after a preview) is freed at
        # once, as it was before the two were split, rather than at the next cyclic garbage collection.
        self.engine = weakref.proxy(engine)
        self._blocks: dict = {}  # (models, share) -> _BlockIndex, for topology pending reasons
        self._profile_shares: dict = {} if profile_shares is None else profile_shares

    def for_fork(self, forked) -> Explainer:
        """The explainer of a fork: its own block counts (the fork's placements change them), the shared rest."""
        return Explainer(forked, self._profile_shares)

    def forget_blocks(self) -> None:
        """Drop the topology counts (the engine started its change list afresh): built again when next needed."""
        self._blocks = {}

    def diagnose(self, demand: Demand) -> Pending:
        """Why a demand cannot be placed now, with numbers (cluster-wide counts from incremental aggregates)."""
        engine = self.engine
        never = engine.never_fits(demand)
        if never is not None:
            return never
        if demand.needs:
            return self._needs(demand)
        models = [m for m in engine.model_devices if not demand.models or m in demand.models]
        label = demand.label
        total = sum(engine.model_devices[m] for m in models)
        needed = demand.count
        if total == 0:  # the inventory has such devices, but only on cordoned nodes
            return Pending(
                demand.id,
                INSUFFICIENT_HEALTHY_CAPACITY,
                f"needs {label}; every node with such devices is cordoned",
                {"needed": needed, "devices": 0},
            )
        healthy = sum(engine.model_healthy.get(m, 0) for m in models)
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
            for free, n in engine.model_hist.get(m, {}).items():
                free_milli += free * n
                if free >= share:
                    fitting += n
        if fitting >= needed:
            block, node = self.largest_block(demand, models, share) if needed > 1 else (1, None)
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

    def _needs(self, demand: Demand) -> Pending:
        """Why a demand that needs capabilities some nodes offer cannot be placed now: those nodes are cordoned, or
        have not the room (the cluster-wide counts of the other reasons would count nodes it cannot use)."""
        engine = self.engine
        offering = sorted(engine.nodes[i].name for i in engine.able(demand.needs))
        open_ = [name for name in offering if engine.nodes[engine.node_index[name]].schedulable]
        what = f"needs {demand.label} on a node with {demand.needs_words}"
        if not open_:
            return Pending(
                demand.id,
                INSUFFICIENT_HEALTHY_CAPACITY,
                f"{what}; every such node ({names_text(offering)}) is cordoned",
                {"nodes": offering, "schedulable": 0},
            )
        return Pending(
            demand.id,
            CAPACITY_IN_USE,
            f"{what}, {cores_text(demand.cpu_milli)} and {memory_text(demand.memory_mib)}; the nodes with it "
            f"({names_text(open_)}) have not that much free",
            {"nodes": open_, "cpu_milli": demand.cpu_milli, "memory_mib": demand.memory_mib},
        )

    def _profile_share(self, demand: Demand, models) -> int | None:
        """The smallest share the profile takes on the models (the inventory's slice tables do not change while
        the engine lives: worked out once per profile and models, not once per pending demand)."""
        engine = self.engine
        key = (demand.slice_profile, frozenset(models))
        if key not in self._profile_shares:
            shares = [
                d.slice_profiles[demand.slice_profile]
                for node in engine.nodes
                for d in node.devices
                if d.model in models and demand.slice_profile in d.slice_profiles
            ]
            self._profile_shares[key] = min(shares) if shares else None
        return self._profile_shares[key]

    def largest_block(self, demand: Demand, models, share: int):
        """(devices, node) of the schedulable node with the most healthy devices of the models with `share`
        free (ties: the first name). Kept per (models, share) and brought up to date from the nodes changed since
        it last looked, so a pending reason costs what changed, not the whole fleet."""
        engine = self.engine
        key = (frozenset(models), share)
        blocks = self._blocks.get(key)
        if blocks is None:
            blocks = self._blocks[key] = _BlockIndex(len(engine.nodes))
            todo: Iterable[int] = range(len(engine.nodes))
        else:
            todo = set(engine.changed[blocks.seen :])
        blocks.seen = len(engine.changed)
        for i in todo:
            node = engine.nodes[i]
            if node.schedulable:
                free = engine.free[i]
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
        return best, min(engine.nodes[i].name for i in blocks.by_block[best])

    def gang(self, demand: Demand, fitted: tuple[str, ...]) -> Pending:
        """Why a replicated demand waits: not one replica fits, or only some of them (`fitted`: the nodes they took)."""
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
