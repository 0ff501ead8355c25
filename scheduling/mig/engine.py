"""The geometry-true placement engine over MIG-capable and other cards (scheduling/mig/__init__.py defines the
fragmentation score; states.py the card states, scoring.py the score, reasons.py the pending reasons,
preemption.py the victims). Pure Python."""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Sequence
from dataclasses import replace

from scheduling.mig import preemption
from scheduling.mig.geometry import Geometry, idle_in_the_way
from scheduling.mig.model import Card, Holding, Instance, MigBinding, MigNode, MigPending, Placed, SliceDemand
from scheduling.mig.reasons import budget_spent, diagnose
from scheduling.mig.scoring import MigScore, model_pressure
from scheduling.mig.states import card_options, card_state, partitioned, released_state, taken_state


class MigEngine:
    """Geometry-true placement over MIG-capable and other cards, with CPU and memory per node.

    ``policy`` "frag" (the MIG fragmentation score) or "first-fit" (first node in inventory order, first card,
    lowest valid start). ``repartition`` False treats every MIG-capable card as pinned (no instance created or
    destroyed, no mode change). Demands are placed one at a time; ``release`` gives a binding back (an instance of a
    repartitionable card is destroyed, a pinned one becomes free).

    ``partition_budget``: the most MIG-capable cards that may hold slices at once (None: no limit; see
    `scheduling.mig.budget`). Once that many are partitioned, a slice goes only to a card that already holds slices,
    or waits, so the empty cards stay for whole-card work; it may change between placements."""

    def __init__(
        self,
        nodes: Sequence[MigNode],
        *,
        policy: str = "frag",
        repartition: bool = True,
        workload: Iterable[SliceDemand] = (),
        seed: int = 0,
        partition_budget: int | None = None,
    ):
        if policy not in ("frag", "first-fit"):
            raise ValueError(f"unknown MIG policy {policy!r}; choose frag or first-fit")
        self.policy, self.repartition = policy, repartition
        self.first_fit = policy == "first-fit"
        self.nodes = list(nodes)
        self.node_index = {node.name: i for i, node in enumerate(self.nodes)}
        self.geometries = _geometries(self.nodes)
        workload = list(workload)
        self.score = MigScore(self.geometries, workload)
        self.pressure = model_pressure(self.nodes, self.geometries, workload)
        self.rank = _node_ranks(len(self.nodes), None if self.first_fit else seed)
        self.cpu = [node.cpu_milli for node in self.nodes]
        self.mem = [node.memory_mib for node in self.nodes]
        self.cards = [[card_state(card, repartition) for card in node.cards] for node in self.nodes]
        self.modes = [[("mig" if card.mig else "whole") for card in node.cards] for node in self.nodes]
        self.known = [[{(i.start, i.size): i for i in card.instances} for card in node.cards] for node in self.nodes]
        self._card_ids: dict = {}
        self._card_tuples: list = []
        self._aggregates: dict = {}
        self._option_memo: dict = {}
        self.node_states = [self._node_state(i) for i in range(len(self.nodes))]
        self.partition_budget = partition_budget
        self.partitioned = sum(partitioned(st) for cards in self.cards for st in cards)
        self.version = [0] * len(self.nodes)
        self.changed: list[int] = []
        self._heaps: dict = {}
        self._by_models: dict = {}
        self.exists: dict = {}  # (models, profile) -> whether any card could ever take it (reasons.py)
        self.has_pinned = any(st[0] == "s" for cards in self.cards for st in cards)  # pinned MIG layouts (reasons)
        # Where each MIG card state is (schedulable nodes): the pending reasons look at distinct states, not cards.
        self.where: dict = {}
        for i, node in enumerate(self.nodes):
            if node.schedulable:
                for j, st in enumerate(self.cards[i]):
                    if st[0] == "m":
                        self.where.setdefault(st, {})[(i, j)] = None

    @property
    def fresh(self) -> bool:
        """Whether a slice may still partition an empty card (the partition budget is not spent)."""
        return self.partition_budget is None or self.partitioned < self.partition_budget

    # -- node states: (cpu, memory, id of the interned card tuple), so the per-shape memos hash three ints ----------

    def _node_state(self, i: int):
        return (self.cpu[i], self.mem[i], self._intern(tuple(self.cards[i])))

    def _intern(self, cards: tuple) -> int:
        cid = self._card_ids.get(cards)
        if cid is None:
            cid = self._card_ids[cards] = len(self._card_tuples)
            self._card_tuples.append(cards)
        return cid

    def _aggregate(self, cid: int):
        found = self._aggregates.get(cid)
        if found is None:
            found = self._aggregates[cid] = self.score.aggregate(self._card_tuples[cid])
        return found

    # -- evaluation of one node state -----------------------------------------------------------------------------

    def _scored_options(self, cid: int, demand: SliceDemand, fresh: bool):
        """The demand's options on a card tuple (first-fit: the chosen ones; frag: each with the class capacities
        it leaves), cached per card tuple and device part of the demand (CPU and memory only change the score)."""
        key = (cid, demand.count, demand.profile, demand.share, demand.models, fresh)
        found = self._option_memo.get(key, _MISSING)
        if found is _MISSING:
            geometries, first_fit = self.geometries, self.first_fit
            cards = enumerate(self._card_tuples[cid])
            options = [o for j, st in cards for o in card_options(j, st, demand, geometries, first_fit, fresh)]
            if not options:
                found = None
            elif self.first_fit:
                found = _first_fit_choices(options, demand)
            else:
                found = self._with_effects(cid, options)
            self._option_memo[key] = found
        return found

    def _with_effects(self, cid: int, options: list):
        """(class capacities, idle capacity, [(card, start, option, (capacities after, idle after))])."""
        cards = self._card_tuples[cid]
        before, idle = self._aggregate(cid)
        changed, free = self.score.changed, self.score.free_milli
        scored = []
        seen: dict = {}
        for option in options:
            j, new = option[0], option[2]
            old = cards[j]
            effect = seen.get((old, new))
            if effect is None:
                effect = seen[(old, new)] = (
                    changed(before, (old,), (new,)),
                    idle - free(old) + free(new),
                )
            scored.append((j, option[1], option, effect))
        return (before, idle, scored)

    def _evaluate(self, state, demand: SliceDemand, fresh: bool = True):
        """(score, choices) of the best way to run the demand on a node in this state, or None; choices are
        (card index, new card state, milli, instance, create) per card taken. ``fresh``: a slice may partition an
        empty card."""
        cpu, mem, cid = state
        if demand.cpu_milli > cpu or demand.memory_mib > mem:
            return None
        if demand.count == 0:
            if self.first_fit:
                return ((), ())
            return (self._cpu_only_key(cpu, cid, demand), ())
        found = self._scored_options(cid, demand, fresh)
        if found is None or self.first_fit:
            return None if found is None else ((), found)
        if demand.profile is not None and demand.count == 1:
            return self._best_single(cpu, cid, demand, found)
        return self._best_set(cpu, cid, demand, found)

    def _cpu_only_key(self, cpu: int, cid: int, demand: SliceDemand) -> tuple:
        """CPU only: the node whose idle cards lose the least usable capacity by the CPU taken, then the fewest
        idle cards."""
        usable, idle = self._aggregate(cid)
        node_frag = self.score.node_frag
        before = node_frag(cpu, usable, idle)
        delta = node_frag(cpu - demand.cpu_milli, usable, idle) - before
        return (0.0, round(delta, 6), round(idle - before, 6))

    def _best_single(self, cpu: int, cid: int, demand: SliceDemand, found):
        """One instance: the option on the least contested model, then with the smallest increase of the node's
        score, then the least idle left."""
        before, idle, scored = found
        new_cpu = cpu - demand.cpu_milli
        delta = _deltas(self.score.node_frag, new_cpu, self.score.node_frag(cpu, before, idle))
        cards, pressure = self._card_tuples[cid], self.pressure
        best = None
        for j, start, option, effect in scored:
            key = (pressure.get(cards[j][1], 0.0), delta(effect), effect[1], j, start)
            if best is None or key < best[0]:
                best = (key, option)
        key, o = best
        return (key[:3], (_choice(o),))

    def _best_set(self, cpu: int, cid: int, demand: SliceDemand, found):
        """Several cards (or a whole card): the best-ranked option per distinct card, scored together."""
        before, idle, scored = found
        node_frag = self.score.node_frag
        f_before = node_frag(cpu, before, idle)
        delta = _deltas(node_frag, cpu, f_before)
        cards, pressure = self._card_tuples[cid], self.pressure
        ranked = sorted(
            (pressure.get(cards[j][1], 0.0), delta(effect), j, start, option, effect)
            for j, start, option, effect in scored
        )
        chosen = _distinct_cards([r[4] for r in ranked], demand.count)
        if chosen is None:
            return None
        load = sum(pressure.get(cards[o[0]][1], 0.0) for o in chosen)
        if len(chosen) == 1:  # one card changes: its option's effect is the node's
            after, left = next(r[5] for r in ranked if r[4] is chosen[0])
        else:
            free = self.score.free_milli
            after = self.score.changed(before, [cards[o[0]] for o in chosen], [o[2] for o in chosen])
            left = idle + sum(free(o[2]) - free(cards[o[0]]) for o in chosen)
        moved = round(node_frag(cpu - demand.cpu_milli, after, left) - f_before, 6)
        return ((round(load, 6), moved, left), tuple(_choice(o) for o in chosen))

    # -- the index: per demand shape a lazy heap of node scores, memoised by node state --------------------------

    def _best(self, demand: SliceDemand, fresh: bool | None = None):
        """The best node for the demand and its choices there, or None. A lazy heap per demand shape (and whether a
        slice may partition an empty card), refreshed for the nodes changed since it was last used."""
        fresh = (self.fresh if fresh is None else fresh) or demand.profile is None
        key = (
            fresh,
            demand.count,
            demand.profile,
            demand.share,
            demand.models,
            demand.cpu_milli,
            demand.memory_mib,
            demand.needs,
        )
        entry = self._heaps.get(key)
        if entry is None:
            entry = self._heaps[key] = [[], None, {}]
        heap, seen, memo = entry
        candidates = self._candidates(demand)
        if seen is None:
            todo = sorted(candidates)
        else:
            todo = set(self.changed[seen:])
            if len(candidates) < len(self.nodes):
                todo &= candidates
        scored = self._rescore(demand, memo, todo, fresh)
        entry[1] = len(self.changed)
        if seen is None:
            heap.extend(scored)
            heapq.heapify(heap)
        else:
            for item in scored:
                heapq.heappush(heap, item)
        version = self.version
        while heap:
            _key, i, ver, choices = heap[0]
            if ver == version[i]:
                return i, choices
            heapq.heappop(heap)
        return None

    def _candidates(self, demand: SliceDemand) -> frozenset[int]:
        """The nodes that have a card of the demand's models at all (every node for CPU-only or any-model demands):
        a constrained demand looks at no other node of the fleet."""
        key = demand.models if demand.count else frozenset()
        found = self._by_models.get(key)
        if found is None:
            found = self._by_models[key] = frozenset(
                i for i, node in enumerate(self.nodes) if not key or any(card.model in key for card in node.cards)
            )
        return found

    def _rescore(self, demand: SliceDemand, memo: dict, todo: Iterable[int], fresh: bool) -> list:
        """Heap entries (score + rank, node, version, choices) of the schedulable nodes in ``todo``."""
        state, version, rank, nodes = self.node_states, self.version, self.rank, self.nodes
        entries = []
        for i in todo:
            if not nodes[i].schedulable or not demand.needs <= nodes[i].capabilities:
                continue
            st = state[i]
            result = memo.get(st, _MISSING)
            if result is _MISSING:
                result = memo[st] = self._evaluate(st, demand, fresh)
            if result is not None:
                entries.append(((*result[0], rank[i]), i, version[i], result[1]))
        return entries

    # -- public API -----------------------------------------------------------------------------------------------

    def place_one(self, demand: SliceDemand) -> MigBinding | MigPending:
        found = self._best(demand)
        if found is None:
            if demand.profile is not None and not self.fresh and self._best(demand, fresh=True) is not None:
                return budget_spent(self, demand)
            return self.diagnose(demand)
        i, choices = found
        placed = [self._placed(i, *choice) for choice in choices]
        self._commit(i, [(c[0], c[1]) for c in choices], -demand.cpu_milli, -demand.memory_mib, placed)
        return MigBinding(demand.id, self.nodes[i].name, tuple(placed), demand.cpu_milli, demand.memory_mib)

    def _placed(self, i: int, j: int, _new, milli: int, instance, create: bool) -> Placed:
        """What a choice takes on card ``j`` of node ``i``: the mode change it needs, the known instance it uses, the
        idle instances the host destroys first (gone from the card from now on)."""
        mode = None
        if instance is not None and self.modes[i][j] == "whole":
            mode = "mig"
        elif instance is None and self.nodes[i].cards[j].geometry is not None and self.modes[i][j] == "mig":
            mode = "whole"
        if instance is None:  # a whole card, or a share of one: a MIG-mode card's idle instances go first
            return Placed(j, milli, None, False, mode, self._destroy(i, j, self._idle(i, j)) if mode else ())
        if not create:  # a free instance of a pinned layout
            return Placed(j, milli, replace(self.known[i][j][(instance[1], instance[2])], busy=True), False, mode)
        idle = self._idle(i, j)
        same = next((k for k in idle if (k.profile, k.start, k.size) == instance), None)
        if same is not None:  # an idle instance of the profile at this placement: used as it is
            return Placed(j, milli, replace(same, busy=True), False, mode)
        held = self.cards[i][j][4] if self.cards[i][j][0] == "m" else ()
        doomed = idle_in_the_way(self.nodes[i].cards[j].geometry, held, idle, instance)
        return Placed(j, milli, Instance(*instance, busy=True), True, mode, self._destroy(i, j, doomed))

    def _idle(self, i: int, j: int) -> list[Instance]:
        """The idle instances card ``j`` of node ``i`` still has: a repartitionable card's state counts only those
        held by work (and those without a GPU instance id, which cannot be destroyed by id)."""
        st = self.cards[i][j]
        held = set(st[4]) if st[0] == "m" else set()
        return [k for k in self.known[i][j].values() if (k.profile, k.start, k.size) not in held]

    def _destroy(self, i: int, j: int, doomed) -> tuple[Instance, ...]:
        known = self.known[i][j]
        for instance in doomed:
            del known[(instance.start, instance.size)]
        return tuple(sorted(doomed, key=lambda k: k.start))

    def _commit(self, i: int, new_states, cpu: int, mem: int, placed=()):
        cards = self.cards[i] = list(self.cards[i])
        schedulable = self.nodes[i].schedulable
        for j, st in new_states:
            old = cards[j]
            cards[j] = st
            self.partitioned += partitioned(st) - partitioned(old)
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

    def _unlocate(self, st, i: int, j: int) -> None:
        where = self.where[st]
        del where[(i, j)]
        if not where:
            del self.where[st]

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

    def fits(self, demand: SliceDemand) -> bool:
        return self._best(demand) is not None

    def release(self, binding: MigBinding) -> None:
        """Give a binding back: whole cards and shares free up (an emptied repartitionable card may change mode
        again), a created instance is destroyed, a pinned layout's instance becomes free."""
        i = self.node_index[binding.node]
        cards = self.released_cards(i, [binding])
        self._commit(i, [(p.card, cards[p.card]) for p in binding.placed], binding.cpu_milli, binding.memory_mib)

    def released_cards(self, i: int, held: Iterable[MigBinding | Holding]) -> list:
        """Node ``i``'s card states once what ``held`` holds there is given back (nothing changes)."""
        cards = list(self.cards[i])
        for holding in held:
            for p in holding.placed:
                card: Card = self.nodes[i].cards[p.card]
                cards[p.card] = released_state(cards[p.card], card, p, self.repartition, self.geometries)
        return cards

    def take(self, node: str, devices, cpu_milli: int, memory_mib: int) -> list[Placed]:
        """What another engine bound on this node (the cycle's milli-share engine): its CPU and memory, a MIG-capable
        card it put work on (whole mode) is taken, a share of another card is used. Returns the mode changes this
        needs: a MIG-mode card goes to whole mode, its idle instances destroyed first."""
        i = self.node_index[node]
        changes = [self._placed(i, j, None, milli, None, False) for j, milli in devices]
        new_states = [(j, taken_state(self.cards[i][j], milli)) for j, milli in devices]
        self._commit(i, new_states, -cpu_milli, -memory_mib, changes)
        return [p for p in changes if p.mode]

    def plan_preemption(self, demand: SliceDemand, candidates: Iterable[Holding], budget: int = 200_000):
        """See `scheduling.mig.preemption.plan`."""
        return preemption.plan(self, demand, candidates, budget)

    def fits_state(self, cpu: int, mem: int, cards: Sequence, demand: SliceDemand) -> bool:
        """Whether a node with this free CPU, memory and these card states could take the demand."""
        return self._evaluate((cpu, mem, self._intern(tuple(cards))), demand, self.fresh) is not None

    def layouts(self):
        """Every MIG-mode card's layout: (node, card index, geometry, [(profile, start, size)]) — the instances
        held by work, and for pinned layouts their idle instances too."""
        for i, node in enumerate(self.nodes):
            for j, st in enumerate(self.cards[i]):
                if st[0] == "m":
                    yield node.name, j, self.geometries[st[1]], list(st[4])
                elif st[0] == "s":
                    yield node.name, j, self.geometries[st[1]], list(st[2])

    def diagnose(self, demand: SliceDemand) -> MigPending:
        return diagnose(self, demand)


def _geometries(nodes: Sequence[MigNode]) -> dict[str, Geometry]:
    """Model -> geometry over the cards (one geometry per model)."""
    geometries: dict[str, Geometry] = {}
    for node in nodes:
        for card in node.cards:
            if card.geometry is not None:
                known = geometries.setdefault(card.model, card.geometry)
                if known != card.geometry:
                    raise ValueError(f"two geometries for model {card.model}")
    return geometries


def _node_ranks(count: int, seed: int | None) -> list[int]:
    """Tie-break position of each node: inventory order (first-fit), else a fixed order drawn from the seed."""
    order = list(range(count))
    if seed is not None:
        random.Random(seed).shuffle(order)
    rank = [0] * count
    for position, i in enumerate(order):
        rank[i] = position
    return rank


def _choice(option) -> tuple:
    """(card index, new card state, milli, instance, create) of an option."""
    return (option[0], option[2], option[3], option[4], option[5])


def _first_fit_choices(options: list, demand: SliceDemand):
    options.sort(key=lambda o: (o[0], o[1]))
    single = demand.profile is not None and demand.count == 1
    chosen = options[:1] if single else _distinct_cards(options, demand.count)
    return None if chosen is None else tuple(_choice(o) for o in chosen)


def _deltas(node_frag, cpu: int, f_before: float):
    """The score's increase for an option's effect ((class capacities, idle) after it), computed once per effect:
    the options of like cards share one (eight empty cards, one score)."""
    known: dict[int, float] = {}

    def delta(effect) -> float:
        found = known.get(id(effect))
        if found is None:
            found = known[id(effect)] = round(node_frag(cpu, effect[0], effect[1]) - f_before, 6)
        return found

    return delta


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
