"""Multi-node gangs: a demand with ``nodes`` > 1 placed all or none, one member on each of that many distinct nodes,
inside one topology domain (rack < block < site).

Domain choice. Among the domains of the asked level that can hold the whole gang now, the one with the fewest nodes
that could take a member, then the fewest free cards of the wanted models (best fit: a whole free rack stays whole
for a larger gang while a partly used one will do). Inside it, the members go on the nodes that keep the fewest
cards stranded (free cards left on a node after its member took its own). A `preferred` gang that no domain of its
level holds spills to the next level (block, then site, then the whole fleet) and there takes its nodes from as few
domains of its own level as it can, the fullest first; `gang_split` says how it was split. A `required` gang waits.

Per member shape a `GangIndex` keeps which nodes could take a member now and how many there are per domain, brought
up to date from the engine's change list like the engine's shape indexes (a decision on 12,000 nodes reads the few
nodes that changed and the domains, never the whole fleet). Pure Python, no Django.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from scheduling.engine.frag import MILLI
from scheduling.engine.model import (
    CAPACITY_IN_USE,
    HEALTHY,
    NO_MATCHING_SPEC,
    TOPOLOGY_CONSTRAINT,
    Binding,
    Demand,
    DemandShape,
    NodeView,
    Pending,
    RunningAllocation,
)

NODE, RACK, BLOCK, SITE = "node", "rack", "block", "site"
FLEET = "fleet"  # beyond a site: anywhere, the last level a preferred gang spills to
LEVELS = (RACK, BLOCK, SITE, FLEET)  # the domain levels a gang can be asked to stay in, closest first
REQUIRED, PREFERRED = "required", "preferred"


def domains_of(node: NodeView) -> dict[str, str]:
    """The node's domain at each level, as paths unique in the fleet. A node without a rack is its own rack; a rack
    without a block is its own block."""
    rack = f"{node.site}/{node.block}/{node.rack or '@' + node.name}"
    return {RACK: rack, BLOCK: f"{node.site}/{node.block}" if node.block else rack, SITE: node.site, FLEET: "*"}


def domain_name(path: str) -> str:
    """A domain's own name (the last part of its path), as the reasons say it."""
    if path == "*":
        return "the fleet"
    name = path.rsplit("/", 1)[-1]
    return name[1:] if name.startswith("@") else name


class Topology:
    """Each node's domain per level, worked out once (the inventory does not change while an engine lives)."""

    def __init__(self, nodes: Sequence[NodeView]):
        self.paths = [domains_of(node) for node in nodes]


class GangIndex:
    """For one member shape: the nodes that could take a member now (``spare``: their free whole cards of the
    wanted models, None when they cannot) and, per level and domain, those nodes."""

    def __init__(self, engine, shape: DemandShape):
        self.engine, self.shape = engine, shape
        self.able = engine.able(shape.needs)
        self.spare: list[int | None] = [None] * len(engine.nodes)
        self.members: dict[str, dict[str, set[int]]] = {level: {} for level in LEVELS}
        self.cards: dict[str, Counter] = {level: Counter() for level in LEVELS}
        self.free = 0  # nodes that could take a member now
        for i in range(len(engine.nodes)):
            self._add(i)
        self.seen = len(engine.changed)

    def refresh(self) -> None:
        changed = self.engine.changed
        for i in set(changed[self.seen :]):
            self._remove(i)
            self._add(i)
        self.seen = len(changed)

    def _free_whole(self, i: int) -> int | None:
        engine, shape = self.engine, self.shape
        node = engine.nodes[i]
        cpu, mem, devs = engine.state[i]
        if not node.schedulable or (self.able is not None and i not in self.able):
            return None
        if cpu < shape.cpu or mem < shape.mem:
            return None
        whole = sum(1 for model, free in devs if free >= MILLI and (not shape.models or model in shape.models))
        return whole if whole >= shape.count else None

    def _add(self, i: int) -> None:
        spare = self.spare[i] = self._free_whole(i)
        if spare is None:
            return
        self.free += 1
        for level, path in self.engine.topology.paths[i].items():
            self.members[level].setdefault(path, set()).add(i)
            self.cards[level][path] += spare

    def _remove(self, i: int) -> None:
        spare = self.spare[i]
        if spare is None:
            return
        self.free -= 1
        for level, path in self.engine.topology.paths[i].items():
            self.members[level][path].discard(i)
            self.cards[level][path] -= spare
        self.spare[i] = None

    def best_domain(self, level: str, nodes: int) -> str | None:
        """The domain of `level` that holds `nodes` members with the fewest such nodes, then the fewest free cards
        (best fit), then by name."""
        held = [
            (len(members), self.cards[level][path], path)
            for path, members in self.members[level].items()
            if len(members) >= nodes
        ]
        return min(held)[2] if held else None

    def largest(self, level: str) -> tuple[str, int]:
        """The domain of `level` with the most nodes that could take a member now, and how many ("", 0: none)."""
        counts = [(len(members), path) for path, members in self.members[level].items() if members]
        if not counts:
            return "", 0
        count, path = min(counts, key=lambda item: (-item[0], item[1]))
        return path, count


class GangPlacer:
    """Places and explains an engine's multi-node gangs on its state (one per engine; a fork makes its own)."""

    def __init__(self, engine):
        self.engine = engine
        self._indexes: dict[tuple, GangIndex] = {}
        self._rooms: dict[tuple, Counter] = {}  # (member shape, level) -> nodes per domain that could hold a member

    def forget(self) -> None:
        """Drop the indexes (the engine started its change list afresh): built again when next needed."""
        self._indexes = {}

    def index(self, demand: Demand) -> GangIndex:
        shape = DemandShape(demand.member)
        index = self._indexes.get(shape.key)
        if index is None:
            index = self._indexes[shape.key] = GangIndex(self.engine, shape)
        else:
            index.refresh()
        return index

    def choose(self, demand: Demand) -> list[int] | None:
        """The member nodes (node positions, leader first), or None when the gang cannot be placed now."""
        index = self.index(demand)
        levels = LEVELS[LEVELS.index(demand.level) :] if demand.mode == PREFERRED else (demand.level,)
        for level in levels:
            path = index.best_domain(level, demand.nodes)
            if path is not None:
                return self._members(index, level, path, demand)
        return None

    def _members(self, index: GangIndex, level: str, path: str, demand: Demand) -> list[int]:
        """The gang's nodes inside the chosen domain: within the asked level's domains, fullest first (a spilled
        gang uses as few of them as it can), the nodes that strand the fewest cards."""
        rank, paths = self.engine.rank, self.engine.topology.paths
        by_domain: dict[str, list[int]] = {}
        for i in index.members[level][path]:
            by_domain.setdefault(paths[i][demand.level], []).append(i)
        ordered = sorted(by_domain.values(), key=lambda nodes: (-len(nodes), min(rank[i] for i in nodes)))
        chosen: list[int] = []
        for nodes in ordered:
            nodes.sort(key=lambda i: (index.spare[i] - demand.count, rank[i]))
            chosen += nodes[: demand.nodes - len(chosen)]
            if len(chosen) == demand.nodes:
                break
        return chosen

    def place(self, demand: Demand) -> list[Binding] | Pending:
        chosen = self.choose(demand)
        if chosen is None:
            return self.explain(demand)
        return self.bind(demand, chosen)

    def fits(self, demand: Demand) -> bool:
        return self.choose(demand) is not None

    def bind(self, demand: Demand, chosen: Sequence[int]) -> list[Binding]:
        """One member on each chosen node (positions, leader first), each taking the first of its node's free whole
        cards of the wanted models (a member takes its cards whole: which ones makes no difference to what is left)."""
        return [self._bind(demand, i, member) for member, i in enumerate(chosen)]

    def _bind(self, demand: Demand, i: int, member: int) -> Binding:
        engine = self.engine
        node, free = engine.nodes[i], engine.free[i]
        whole = [
            j
            for j, device in enumerate(node.devices)
            if device.health == HEALTHY and free[j] >= MILLI and (not demand.models or device.model in demand.models)
        ]
        devices = tuple((j, MILLI) for j in whole[: demand.count])
        engine._apply(i, devices, demand.cpu_milli, demand.memory_mib)
        return Binding(demand.id, node.name, devices, demand.cpu_milli, demand.memory_mib, member=member)

    # -- reasons ----------------------------------------------------------------------------------------------

    def never_fits(self, demand: Demand) -> Pending | None:
        """`no_matching_spec` when a member could never run on any node, or no domain of a required level (of the
        fleet, for a preferred gang) has enough nodes that could hold a member even empty."""
        member = self.engine.never_fit.check(demand.member)
        if member is not None:
            return Pending(demand.id, member.reason, member.message, member.numbers)
        level = demand.level if demand.mode == REQUIRED else FLEET
        counts = self._rooms_of(demand, level)
        largest, most = max(counts.items(), key=lambda item: item[1], default=("", 0))
        if most >= demand.nodes:
            return None
        where = f"one {level}" if level != FLEET else "the fleet"
        return Pending(
            demand.id,
            NO_MATCHING_SPEC,
            f"needs {demand.label} in {where}; no {level if level != FLEET else 'part of the fleet'} has "
            f"{demand.nodes} nodes that could hold {demand.count}×{_models(demand)}: the largest has {most}"  # noqa: RUF001
            + (f" ({domain_name(largest)})" if largest and level != FLEET else "")
            + ", so it can never run on this inventory",
            {"nodes": demand.nodes, "level": level, "largest": most, "domain": domain_name(largest) if most else ""},
        )

    def _rooms_of(self, demand: Demand, level: str) -> Counter:
        """Per domain of `level`, the nodes that could hold a member even empty: worked out once per member shape (the
        inventory does not change while an engine lives)."""
        key = (DemandShape(demand.member).key, level)
        counts = self._rooms.get(key)
        if counts is None:
            paths = self.engine.topology.paths
            counts = self._rooms[key] = Counter(
                paths[i][level] for i, node in enumerate(self.engine.nodes) if could_hold(node, demand)
            )
        return counts

    def explain(self, demand: Demand) -> Pending:
        """Why the gang waits, with its numbers: `topology_constraint` when enough nodes are free but no domain of
        the level holds them together, `capacity_in_use` when too few are free at all."""
        never = self.never_fits(demand)
        if never is not None:
            return never
        index = self.index(demand)
        free = index.free
        what = f"{demand.nodes} free nodes × {demand.count} {_models(demand)}"  # noqa: RUF001
        numbers = {"nodes": demand.nodes, "cards_per_node": demand.count, "level": demand.level, "free_nodes": free}
        if free < demand.nodes:
            return Pending(
                demand.id,
                CAPACITY_IN_USE,
                f"needs {what}; {free} such node{'s are' if free != 1 else ' is'} free now",
                numbers,
            )
        path, most = index.largest(demand.level)
        return Pending(
            demand.id,
            TOPOLOGY_CONSTRAINT,
            f"needs {what} in one {demand.level}; best {demand.level} {domain_name(path)} has {most} "
            f"({free} such nodes are free in all)",
            {**numbers, "best_domain": domain_name(path), "best_free_nodes": most},
        )


def _models(demand: Demand) -> str:
    return "/".join(sorted(demand.models)) or "cards"


def could_hold(node: NodeView, demand: Demand) -> bool:
    """Whether the node, empty and healthy, could hold one member (whatever its state now)."""
    cards = sum(1 for device in node.devices if not demand.models or device.model in demand.models)
    return (
        cards >= demand.count
        and node.cpu_milli >= demand.cpu_milli
        and node.memory_mib >= demand.memory_mib
        and demand.needs <= node.capabilities
    )


def level_used(paths: Sequence[dict[str, str]]) -> str:
    """The closest level one domain of which holds all of a gang's members (`paths`: each member node's domains)."""
    return next(level for level in LEVELS if len({path[level] for path in paths}) == 1)


def gang_split(bindings: Sequence[Binding], nodes: Sequence[NodeView], level: str) -> dict:
    """How a gang's members were placed: the closest level that holds them all and the domains of the asked level
    they span, as {code, message, numbers} for the decision's record. `nodes` are the engine's nodes."""
    by_name = {node.name: node for node in nodes}
    paths = [domains_of(by_name[binding.node]) for binding in bindings]
    used = level_used(paths)
    asked = sorted({p[level] for p in paths})
    spilled = LEVELS.index(used) > LEVELS.index(level)
    names = ", ".join(domain_name(path) for path in asked)
    return {
        "code": "gang_split" if spilled else "gang_together",
        "message": f"{len(bindings)} nodes in {len(asked)} {level}s ({names}), inside one {used}"
        if spilled
        else f"{len(bindings)} nodes in one {level} ({names})",
        "numbers": {"level": level, "level_used": used, "domains": [domain_name(path) for path in asked]},
    }


# -- when the missing nodes free -------------------------------------------------------------------------------------


def with_domain_frees(
    engine,
    pending: Pending,
    demand: Demand,
    allocations: Sequence[RunningAllocation],
    ends: Mapping[str, datetime],
    now,
) -> Pending:
    """A gang's `topology_constraint` with when its best domain gets the nodes it lacks, from the running work's
    approved ends (`ends` by allocation id): "best rack r07 has 3 (1 more frees in ~2 h; ...)". Unchanged when that
    domain cannot get them from ends alone (too few of its nodes could ever hold a member, cordoned ones)."""
    if pending.reason != TOPOLOGY_CONSTRAINT or demand.nodes <= 1:
        return pending
    frees = domain_frees(engine, demand, allocations, ends)
    if frees is None:
        return pending
    more, at = frees
    seconds = max(0.0, (at - now).total_seconds())
    best = f"has {pending.numbers['best_free_nodes']} ("
    return replace(
        pending,
        message=pending.message.replace(
            best, f"{best}{more} more free{'s' if more == 1 else ''} in ~{_wait_text(seconds)}; ", 1
        ),
        numbers={**pending.numbers, "more_nodes": more, "more_free_at": at.isoformat()},
    )


def domain_frees(
    engine, demand: Demand, allocations: Sequence[RunningAllocation], ends: Mapping[str, datetime]
) -> tuple[int, datetime] | None:
    """How many more nodes the gang's best domain (the one with the most nodes that could take a member now) needs,
    and when the last of them frees as the running work on them ends, each node freeing once the work ending first
    on it has given back enough for one member; None when the domain's other nodes cannot give them."""
    index = engine.gangs.index(demand)
    path, most = index.largest(demand.level)
    lacking = demand.nodes - most
    if not path or lacking <= 0:
        return None
    running: dict[str, list[RunningAllocation]] = defaultdict(list)
    for allocation in allocations:
        if ends.get(allocation.id) is not None:  # work without an approved end frees nothing by its end
            running[allocation.node].append(allocation)
    paths = engine.topology.paths
    times = sorted(
        at
        for i, node in enumerate(engine.nodes)
        if paths[i][demand.level] == path
        and index.spare[i] is None
        and node.schedulable
        and could_hold(node, demand)
        and (at := _node_frees_at(engine, i, demand, running[node.name], ends)) is not None
    )
    return (lacking, times[lacking - 1]) if len(times) >= lacking else None


def _node_frees_at(
    engine, i: int, demand: Demand, running: list[RunningAllocation], ends: Mapping[str, datetime]
) -> datetime | None:
    """When node i could take one member, its running work given back in the order it ends; None: never by that."""
    node = engine.nodes[i]
    cpu, mem, free = engine.cpu[i], engine.mem[i], list(engine.free[i])
    wanted = [
        j
        for j, device in enumerate(node.devices)
        if device.health == HEALTHY and (not demand.models or device.model in demand.models)
    ]
    for allocation in sorted(running, key=lambda allocation: ends[allocation.id]):
        cpu, mem = cpu + allocation.cpu_milli, mem + allocation.memory_mib
        for j, milli in allocation.devices:
            free[j] += milli
        whole = sum(1 for j in wanted if free[j] >= MILLI)
        if whole >= demand.count and cpu >= demand.cpu_milli and mem >= demand.memory_mib:
            return ends[allocation.id]
    return None


def _wait_text(seconds: float) -> str:
    """A wait in round words: ~40 min, ~2 h, ~3 d."""
    if seconds < 3600:
        return f"{max(1, round(seconds / 60))} min"
    if seconds < 48 * 3600:
        return f"{round(seconds / 3600)} h"
    return f"{round(seconds / 86400)} d"
