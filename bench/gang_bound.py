"""The ceiling of the gang benchmark: the most GPU capacity any placement could have allocated when the arrived demand
reaches 100 %, even one chosen knowing the whole sequence (refusing work that fits is allowed).

A relaxation, so a true upper bound: cards are pooled per rack and model (no node boundaries for single pods, CPU and
memory ignored), but every gang keeps what no placement can escape:
- its members take `CARDS_PER_MEMBER` whole cards on nodes of its model that could hold a member even empty
  (`could_hold`): a gang never uses a card of another model or of a smaller node;
- a `required` gang of n nodes stays inside one rack (block) of its level that has at least n such nodes, and one
  class of gangs takes at most n·⌊k/n⌋ of a domain's k such nodes; a `preferred` gang may use any such node.
The best allocation under these rules is a maximum flow (demand classes -> pools of cards -> sink), worked out with
Dinic's algorithm and augmented arrival by arrival, and averaged over the events of the arrived-100 % bucket exactly
as the variants' alloc@100 is (bench/traces.py `_at`).
"""

from __future__ import annotations

from collections import Counter, deque

from scheduling.engine import Demand, NodeView
from scheduling.engine.frag import MILLI
from scheduling.engine.gang import BLOCK, RACK, REQUIRED, could_hold, domains_of

UNLIMITED = 1 << 62


class FlowNetwork:
    """Dinic's maximum flow on integer capacities; `flow()` can be called again after capacities grow."""

    def __init__(self):
        self.edges: list[list[list]] = []  # per vertex: [to, capacity left, index of the reverse edge]
        self.total = 0

    def vertex(self) -> int:
        self.edges.append([])
        return len(self.edges) - 1

    def edge(self, source: int, target: int, capacity: int) -> list:
        forward = [target, capacity, len(self.edges[target])]
        self.edges[source].append(forward)
        self.edges[target].append([source, 0, len(self.edges[source]) - 1])
        return forward

    def flow(self, source: int, sink: int) -> int:
        while (levels := self._levels(source, sink)) is not None:
            cursor = [0] * len(self.edges)
            while pushed := self._push(source, sink, UNLIMITED, levels, cursor):
                self.total += pushed
        return self.total

    def _levels(self, source: int, sink: int) -> list[int] | None:
        levels = [-1] * len(self.edges)
        levels[source] = 0
        queue = deque([source])
        while queue:
            vertex = queue.popleft()
            for target, capacity, _ in self.edges[vertex]:
                if capacity and levels[target] < 0:
                    levels[target] = levels[vertex] + 1
                    queue.append(target)
        return levels if levels[sink] >= 0 else None

    def _push(self, vertex: int, sink: int, limit: int, levels: list[int], cursor: list[int]) -> int:
        if vertex == sink:
            return limit
        out = self.edges[vertex]
        while cursor[vertex] < len(out):
            edge = out[cursor[vertex]]
            target, capacity, back = edge
            if capacity and levels[target] == levels[vertex] + 1:
                pushed = self._push(target, sink, min(limit, capacity), levels, cursor)
                if pushed:
                    edge[1] -= pushed
                    self.edges[target][back][1] += pushed
                    return pushed
            cursor[vertex] += 1
        return 0


class GangCeiling:
    """The flow network of one fleet: pools of cards, and the demand classes added as they first arrive."""

    def __init__(self, nodes: list[NodeView], member: Demand):
        self.net = FlowNetwork()
        self.source, self.sink = self.net.vertex(), self.net.vertex()
        self.member = member  # the gangs' member shape, any model
        self.eligible: dict[tuple[str, str], int] = Counter()  # (rack, model) -> nodes that could hold a member
        self.block_of: dict[str, str] = {}
        pooled_cards: Counter = Counter()  # (rack or "", model) -> cards; "" for cards no member could use
        for node in nodes:
            paths = domains_of(node)
            self.block_of[paths[RACK]] = paths[BLOCK]
            for model, cards in Counter(device.model for device in node.devices).items():
                holds = could_hold(node, _member_of(member, model))
                self.eligible[paths[RACK], model] += holds
                pooled_cards[paths[RACK] if holds else "", model] += cards
        self.pools: dict[tuple[str, str], int] = {}
        self.models = sorted({model for _, model in pooled_cards})
        self.any_pool = {model: self.net.vertex() for model in self.models}  # every pool of the model
        self.any_card = {model: self.net.vertex() for model in self.models}  # and the cards no member can use
        for (rack, model), cards in pooled_cards.items():
            if rack:
                pool = self.pools[rack, model] = self.net.vertex()
                self.net.edge(self.any_pool[model], pool, UNLIMITED)
                self.net.edge(pool, self.sink, cards * MILLI)
            else:
                self.net.edge(self.any_card[model], self.sink, cards * MILLI)
        for model in self.models:
            self.net.edge(self.any_card[model], self.any_pool[model], UNLIMITED)
        self.classes: dict[tuple, list] = {}  # class key -> its source edge
        self.blocks: dict[tuple[str, str], int] = {}

    def add(self, demand: Demand) -> None:
        """One more arrival: its class's source edge grows by its GPU milli (CPU-only demands add nothing)."""
        milli = demand.count * demand.share * demand.nodes
        if not milli:
            return
        key = (demand.models, demand.nodes, demand.level, demand.mode) if demand.nodes > 1 else (demand.models,)
        if key not in self.classes:
            vertex = self.net.vertex()
            self.classes[key] = self.net.edge(self.source, vertex, 0)
            self._connect(vertex, demand)
        self.classes[key][1] += milli

    def _connect(self, vertex: int, demand: Demand) -> None:
        models = [model for model in self.models if not demand.models or model in demand.models]
        if demand.nodes <= 1:
            for model in models:
                self.net.edge(vertex, self.any_card[model], UNLIMITED)
            return
        for model in models:
            if demand.mode != REQUIRED:
                self.net.edge(vertex, self.any_pool[model], UNLIMITED)
                continue
            per_domain: Counter = Counter()
            for (rack, pool_model), count in self.eligible.items():
                if pool_model == model:
                    per_domain[rack if demand.level == RACK else self.block_of[rack]] += count
            for domain, count in per_domain.items():
                usable = demand.nodes * (count // demand.nodes) * demand.count * MILLI
                if usable:
                    self.net.edge(vertex, self._domain_vertex(domain, model, demand.level), usable)

    def _domain_vertex(self, domain: str, model: str, level: str) -> int:
        if level == RACK:
            return self.pools[domain, model]
        if (domain, model) not in self.blocks:
            block = self.blocks[domain, model] = self.net.vertex()
            for (rack, pool_model), pool in self.pools.items():
                if pool_model == model and self.block_of[rack] == domain:
                    self.net.edge(block, pool, UNLIMITED)
        return self.blocks[domain, model]

    def allocated(self) -> int:
        """The most GPU milli the arrivals so far could hold together."""
        return self.net.flow(self.source, self.sink)


def _member_of(member: Demand, model: str) -> Demand:
    return Demand(
        member.id,
        count=member.count,
        models=frozenset({model}),
        cpu_milli=member.cpu_milli,
        memory_mib=member.memory_mib,
    )


def hindsight_bound(nodes: list[NodeView], demands: list[Demand], member: Demand, at: int = 100) -> float:
    """The ceiling of alloc@`at`: the mean, over the arrivals in the arrived-`at` % bucket (else `at` - 1, then
    `at` + 1, as `_at` does), of the most capacity (%) the arrivals up to each could hold together."""
    capacity = sum(len(node.devices) for node in nodes) * MILLI
    ceiling = GangCeiling(nodes, member)
    arrived, buckets = 0, {}
    for demand in demands:
        ceiling.add(demand)
        arrived += demand.count * demand.share * demand.nodes
        bucket = round(100 * arrived / capacity)
        if bucket > at + 1:
            break
        if bucket >= at - 1:
            buckets.setdefault(bucket, []).append(100 * ceiling.allocated() / capacity)
    for bucket in (at, at - 1, at + 1):
        if buckets.get(bucket):
            return sum(buckets[bucket]) / len(buckets[bucket])
    return float("nan")
