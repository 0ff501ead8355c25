"""The scheduling cycle's MIG part: slice demands for MIG-capable models placed geometry-true by `scheduling.mig`.

`cycle_engine` builds, from the cycle's snapshot, the pair of engines the cycle (and the order preview of a MIG
slice) places with: a `MigEngine` over the MIG-capable cards (free CPU and memory per node after what runs there,
the devices' MIG mode and GPU instances, held ones never touched, and the node's layout pin) and the milli-share
engine over the rest, which never places a slice of a MIG model by milli-share and never puts a whole card on a
MIG-mode card that cannot change mode. `CycleEngine.place` takes the demands in the cycle's one queue order
(priority class, fair share, submission time), each demand on its engine; what one engine binds on a node the
other sees taken at once (CPU, memory and the cards), so a slice never jumps the queue and a pending slice holds
back lower-priority work for the same models (`higher_priority_ahead`) as any demand does.

`CycleEngine.plan_preemption` plans victims for a waiting slice on the MIG engine (see `MigEngine.plan_preemption`:
the freed memory slices must form a valid placement). `partition_budget` keeps slices off the empty cards a
waiting whole-card request needs. `CycleEngine.committed_plans` gives each committed binding's card plan (the idle
instances the host destroys first, the mode it sets), which the cycle stores on `AllocationDevice.mig_changes`;
`record_instances` writes the cards' new state (destroyed rows gone, each bound GPU instance held: a free instance of
a pinned layout or an idle one reused gets its holder, a new one is created for repartitioning, its GI/CI ids and
MIG UUID filled in by the host driver; the mode) after the allocations exist, checking every touched layout;
`release_instances` destroys created instances and frees the others when allocations are released. A fixed number
of queries per cycle whatever the size.
"""

from collections.abc import Callable, Iterable
from dataclasses import replace

from django.db.models import Prefetch, Q

from catalog.choices import SpecStatus
from catalog.models import AcceleratorModel, ResourceSpec, SliceProfile
from scheduling import mig
from scheduling.engine import (
    HEALTHY,
    MILLI,
    Binding,
    Demand,
    DeviceView,
    NodeView,
    Pending,
    PlacementEngine,
    PlacementResult,
    RunningAllocation,
    Snapshot,
    place_in_order,
)
from scheduling.mig import services as mig_services
from scheduling.models import Allocation, Device, MigInstance


class CycleEngine:
    """The milli-share engine and, when the catalog has MIG-capable models, the MIG engine, as one engine with
    `fits`, `place_one` and `place` (demands in the given order, `place_in_order`)."""

    def __init__(self, milli: PlacementEngine, mig_engine=None, capable=(), shares=None, holdings=()):
        self.start = milli  # the cycle's start state, frozen from here: `at_start` and the placing engine fork it
        self.milli = milli.fork()
        self.mig = mig_engine
        self.capable = frozenset(capable)
        self.shares = shares or {}  # (model, profile) -> the milli-share the record keeps for a slice
        self.holdings = list(holdings)  # running work as the MIG engine sees it, for preemption
        self.instances: dict[str, tuple[mig.Placed, ...]] = {}  # demand id -> the GPU instances bound for it
        self.closed: list[str] = []  # nodes closed to this cycle's placements (close_node), at_start's too
        # (demand id, node, card) -> what the host changes on a MIG-capable card first: idle instances in the way
        # destroyed, the mode switched (for slices, and for whole cards or shares on a MIG-mode card)
        self.card_plans: dict[tuple[str, str, int], mig.Placed] = {}

    def at_start(self, running: Iterable[RunningAllocation], closed: Iterable[str] | None = None) -> PlacementEngine:
        """A milli-share engine at the state the cycle started from plus `running` (bindings of this cycle, as
        allocations), with the nodes this cycle closed (or those of `closed`) closed: what the head's reservation and
        preemption planning work on. A fork, so the shape indexes
        scored on the start state are copied and refreshed for the nodes that changed, not scored again; the same
        state and policy as an engine built over the cycle's snapshot and `running`, so the same answers."""
        engine = self.start.fork()
        for name in self.closed if closed is None else closed:
            engine.close_node(name)
        engine.hold(running)
        return engine

    def is_mig(self, demand: Demand) -> bool:
        return self.mig is not None and is_mig_demand(demand, self.capable)

    def fits(self, demand: Demand) -> bool:
        return self.mig.fits(slice_demand(demand)) if self.is_mig(demand) else self.milli.fits(demand)

    def fits_now(self, demand: Demand, known: dict) -> bool:
        """`fits` where only yes or no matters (see PlacementEngine.fits_now)."""
        return self.mig.fits(slice_demand(demand)) if self.is_mig(demand) else self.milli.fits_now(demand, known)

    def place(self, demands: Iterable[Demand], backfill: bool = False) -> PlacementResult:
        return place_in_order(self, list(demands), backfill)

    def place_one(self, demand: Demand) -> list[Binding] | Pending:
        if self.is_mig(demand):
            return self._place_slice(demand)
        outcome = self.milli.place_one(demand)
        if self.mig is not None and not isinstance(outcome, Pending):
            for binding in outcome:
                for change in self.mig.take(binding.node, binding.devices, binding.cpu_milli, binding.memory_mib):
                    self.card_plans[(demand.id, binding.node, change.card)] = change
        return outcome

    def _place_slice(self, demand: Demand) -> list[Binding] | Pending:
        outcome = self.mig.place_one(slice_demand(demand))
        if isinstance(outcome, mig.MigPending):
            return Pending(demand.id, outcome.reason, outcome.message, dict(outcome.numbers))
        share = self.shares.get((next(iter(demand.models)), demand.slice_profile), 1)
        devices = tuple((p.card, share) for p in outcome.placed)
        self.milli.take(outcome.node, [p.card for p in outcome.placed], outcome.cpu_milli, outcome.memory_mib)
        self.instances[demand.id] = outcome.placed
        for p in outcome.placed:
            self.card_plans[(demand.id, outcome.node, p.card)] = p
        return [Binding(demand.id, outcome.node, devices, outcome.cpu_milli, outcome.memory_mib)]

    def committed_plans(self, bindings) -> dict[tuple[str, str, int], mig.Placed]:
        """The card plans of the bindings the cycle commits. A plan of a demand held back after placement (the
        head's reservation) is not carried out, but what it destroyed or switched the engine counted on for the
        plans placed after it on the same card: those come with the next committed plan of that card."""
        committed = {(binding.demand_id, binding.node) for binding in bindings}
        carried: dict[tuple[str, int], mig.Placed] = {}
        plans = {}
        for (demand_id, node, card), placed in self.card_plans.items():
            before = carried.pop((node, card), None)
            if before is not None:
                placed = replace(placed, destroy=(*before.destroy, *placed.destroy), mode=placed.mode or before.mode)
            if (demand_id, node) in committed:
                plans[(demand_id, node, card)] = placed
            elif placed.destroy or placed.mode:
                carried[(node, card)] = replace(placed, instance=None, create=False)
        return plans

    def close_node(self, name: str) -> None:
        """No new work on this node (the preview keeps an order off a node reserved for the queue's head; the cycle
        keeps work off the nodes of a backend that does not answer)."""
        self.closed.append(name)
        self.milli.close_node(name)
        if self.mig is not None:
            self.mig.close_node(name)

    def plan_preemption(self, demand: Demand, may_evict: Callable[[str], bool]) -> mig.MigPreemptionPlan:
        """Victims for a waiting slice among the running work of lower priority that `may_evict` allows."""
        candidates = [h for h in self.holdings if h.priority < demand.priority and may_evict(h.id)]
        return self.mig.plan_preemption(slice_demand(demand), candidates)


def is_mig_demand(demand: Demand, capable: Iterable[str]) -> bool:
    """A slice of MIG-capable models only: placed geometry-true."""
    return bool(demand.slice_profile and demand.models) and all(model in capable for model in demand.models)


def placed_geometry_true(demand: Demand) -> bool:
    """Whether the cycle places this demand on the MIG engine (one query, for slices only)."""
    if not (demand.slice_profile and demand.models):
        return False
    capable = AcceleratorModel.objects.filter(slug__in=demand.models, mig_geometry__isnull=False).count()
    return capable == len(demand.models)


def mig_capable_models() -> dict[str, tuple[AcceleratorModel, mig.Geometry]]:
    models = list(AcceleratorModel.objects.filter(mig_geometry__isnull=False))
    geometries = mig_services.geometries_by_model(models)
    return {m.slug: (m, geometries[m.pk]) for m in models if m.pk in geometries}


def cycle_engine(
    cluster,
    demands: list[Demand],
    policy: str = "default",
    milli_engine: Callable[[Snapshot], PlacementEngine] | None = None,
) -> CycleEngine:
    """The engines for the cycle's snapshot; ``demands`` are the workload both learn their scores from.
    ``milli_engine(snapshot)`` gives the milli-share engine's start state (the scheduler's kept engine); without
    it one is built over the snapshot."""
    milli_engine = milli_engine or (lambda snapshot: PlacementEngine(snapshot, policy, workload=demands))
    snapshot = cluster.snapshot
    capable = mig_capable_models()
    if not capable:
        return CycleEngine(milli_engine(snapshot))
    shares = {
        (p.accelerator.slug, p.name): int(p.compute_fraction * MILLI)
        for p in SliceProfile.objects.filter(accelerator__slug__in=capable).select_related("accelerator")
    }
    rows: dict[int, Device] = {
        d.pk: d
        for d in Device.objects.filter(model__slug__in=capable)
        .select_related("node")
        .prefetch_related(
            Prefetch("mig_instances", queryset=MigInstance.objects.select_related("profile", "allocation"))
        )
    }
    inventory = _MigInventory(cluster, capable, rows)
    pairs = [inventory.node(node) for node in snapshot.nodes]
    engine_nodes = [mig_node for mig_node, _node in pairs]
    milli_snapshot = Snapshot([node for _mig_node, node in pairs], snapshot.allocations)
    mig_engine = mig.MigEngine(
        engine_nodes,
        workload=[*map(slice_demand, demands), *_offered(capable)],
        seed=0,
        partition_budget=partition_budget(engine_nodes, demands, capable, shares),
    )
    return CycleEngine(
        milli_engine(milli_snapshot),
        mig_engine,
        capable,
        shares,
        inventory.holdings(snapshot.allocations),
    )


def partition_budget(nodes: list[mig.MigNode], demands: list[Demand], capable, shares) -> int | None:
    """The MIG engine's partition budget (`scheduling.mig.budget`) from the queue's mix, while whole-card work that
    may use a MIG-capable card waits in it: then slices partition no more empty cards than their share of the
    waiting demand gives them, and the rest stay for that work. With none waiting, no budget: a slice never waits
    for cards nobody else is asking for. A slice counts its profile's compute fraction."""
    models = frozenset(capable)
    if not any(not d.slice_profile and d.count and (not d.models or d.models & models) for d in demands):
        return None
    cards = [card for node in nodes for card in node.cards]
    capable_cards = sum(1 for card in cards if card.geometry is not None)
    mix = mig.DemandMix(capable_cards, len(cards) - capable_cards, models)
    for demand in demands:
        if is_mig_demand(demand, capable):
            mix.see(slice_demand(demand), shares.get((next(iter(demand.models)), demand.slice_profile), mig.MILLI))
        elif not demand.slice_profile:  # a time-sliced slice of other models takes no card of its own
            mix.see(slice_demand(demand), 0)
    return mix.budget


class _MigInventory:
    """The cycle's snapshot as the two engines see the MIG-capable cards."""

    def __init__(self, cluster, capable, rows: dict[int, Device]):
        self.cluster, self.capable, self.rows = cluster, capable, rows
        self.used_cpu: dict[str, int] = {}
        self.used_mem: dict[str, int] = {}
        self.used_milli: dict[tuple[str, int], int] = {}
        for allocation in cluster.snapshot.allocations:
            self.used_cpu[allocation.node] = self.used_cpu.get(allocation.node, 0) + allocation.cpu_milli
            self.used_mem[allocation.node] = self.used_mem.get(allocation.node, 0) + allocation.memory_mib
            for position, milli in allocation.devices:
                key = (allocation.node, position)
                self.used_milli[key] = self.used_milli.get(key, 0) + milli

    def row(self, node: str, position: int) -> Device | None:
        return self.rows.get(self.cluster.device_ids[(node, position)])

    def node(self, node: NodeView) -> tuple[mig.MigNode, NodeView]:
        """The MIG engine's node (free CPU and memory) and the milli-share engine's (no MIG slices by share)."""
        cards, devices = [], []
        for device in node.devices:
            card, milli_device = self._card(node.name, device)
            cards.append(card)
            devices.append(milli_device)
        mig_node = mig.MigNode(
            node.name,
            node.cpu_milli - self.used_cpu.get(node.name, 0),
            node.memory_mib - self.used_mem.get(node.name, 0),
            tuple(cards),
            node.schedulable,
            node.capabilities,
        )
        return mig_node, replace(node, devices=tuple(devices))

    def _card(self, node: str, device: DeviceView) -> tuple[mig.Card, DeviceView]:
        row = self.row(node, device.index)
        busy = self.used_milli.get((node, device.index), 0)
        healthy = device.health == HEALTHY
        if row is None:
            return mig.Card(device.index, device.model, busy_milli=min(busy, mig.MILLI), healthy=healthy), device
        pinned = row.node.mig_layout_pinned
        instances = tuple(_instance(i) for i in row.mig_instances.all())
        held = any(i.busy for i in instances)
        # Work without a GPU instance on a MIG-mode card holds the whole card: as if in whole mode, taken.
        whole_work = busy and not held
        draining = bool(row.mig_mode_wanted)  # an operator's mode switch waits for its work to end: nothing new
        card = mig.Card(
            device.index,
            device.model,
            self.capable[device.model][1],
            mig=row.mig_mode and not whole_work,
            instances=instances,
            pinned=pinned,
            healthy=healthy and not draining,
            busy_milli=min(busy, mig.MILLI) if whole_work else 0,
        )
        # no whole card on a MIG card that cannot change mode, nor on one being drained
        blocked = (row.mig_mode and (pinned or held)) or draining
        return card, replace(device, slice_profiles={}, capacity=0 if blocked else device.capacity)

    def holdings(self, allocations: Iterable[RunningAllocation]) -> list[mig.Holding]:
        """Running allocations on nodes with MIG-capable cards, with the GPU instances (or whole cards) they hold:
        what releasing them would give back to the MIG engine."""
        held: dict[tuple[int, str], mig.Instance] = {}
        for row in self.rows.values():
            for instance in row.mig_instances.all():
                if instance.allocation is not None:
                    held[(row.pk, str(instance.allocation.request_id))] = _instance(instance)
        out = []
        for allocation in allocations:
            placed = []
            for position, milli in allocation.devices:
                row = self.row(allocation.node, position)
                instance = None if row is None else held.get((row.pk, allocation.id))
                placed.append(mig.Placed(position, milli, instance))
            if any(self.row(allocation.node, p.card) is not None for p in placed):
                out.append(
                    mig.Holding(
                        allocation.id,
                        allocation.node,
                        tuple(placed),
                        allocation.cpu_milli,
                        allocation.memory_mib,
                        allocation.priority,
                        allocation.started_at,
                    )
                )
        return out


def _instance(row: MigInstance) -> mig.Instance:
    return mig.Instance(
        row.profile.name, row.start, row.size, row.gi_id, row.ci_id, row.uuid, busy=row.allocation_id is not None
    )


def _offered(capable) -> list[mig.SliceDemand]:
    """What the catalog offers on MIG-capable models, one demand per active spec: the workload's prior, so a
    placement keeps room for the profiles people can order even when the queue holds only one kind."""
    specs = (
        ResourceSpec.objects.filter(status=SpecStatus.ACTIVE, accelerator_models__slug__in=capable)
        .values_list("pk", "slice_profile__name", "accelerator_count", "cpu_cores", "memory_gb")
        .distinct()
    )
    return [
        mig.SliceDemand(
            f"spec-{pk}", 1 if profile else count, profile=profile, cpu_milli=cpu * 1000, memory_mib=mem * 1024
        )
        for pk, profile, count, cpu, mem in specs
    ]


def slice_demand(demand: Demand) -> mig.SliceDemand:
    # The MIG engine has no anti-affinity: a serving request's replicas of MIG slices stay together on one node.
    demand = demand.colocated
    return mig.SliceDemand(
        demand.id,
        demand.count,
        profile=demand.slice_profile,
        share=demand.share,
        models=demand.models,
        cpu_milli=demand.cpu_milli,
        memory_mib=demand.memory_mib,
        needs=demand.needs,
        needs_label=demand.needs_label,
    )


def describe(placed: mig.Placed, node: str) -> tuple[str, dict]:
    """The record's words and numbers for one bound instance."""
    instance = placed.instance
    end = instance.start + instance.size - 1
    slices = f"{instance.start}–{end}" if end > instance.start else str(instance.start)  # noqa: RUF001
    how = "created for it by repartitioning" if placed.create else "an existing free instance"
    mode = " (the card switches to MIG mode first)" if placed.mode == "mig" else ""
    return (
        f"MIG {instance.profile} on gpu {placed.card} of {node}, memory slices {slices}, {how}{mode}.",
        {
            "profile": instance.profile,
            "gpu": placed.card,
            "start": instance.start,
            "size": instance.size,
            "gi_id": instance.gi_id,
            "ci_id": instance.ci_id,
            "uuid": instance.uuid,
            "create": placed.create,
            "mode_change": placed.mode,
        },
    )


def card_changes(placed: mig.Placed | None) -> dict:
    """The host's changes on one card before the work starts (an `AllocationDevice.mig_changes`): the idle GPU
    instances it destroys, by id, and the mode it sets."""
    if placed is None or not (placed.destroy or placed.mode):
        return {}
    return {
        "destroy": [
            {"profile": i.profile, "start": i.start, "size": i.size, "gi_id": i.gi_id, "ci_id": i.ci_id, "uuid": i.uuid}
            for i in placed.destroy
        ],
        "mode": placed.mode,
    }


def record_instances(engine: CycleEngine, plans: dict[tuple[str, str, int], mig.Placed], bindings, cluster) -> None:
    """Write what the committed bindings change on MIG-capable cards (the allocations exist now; ``plans`` are
    `CycleEngine.committed_plans`): the idle instances the host destroys first are gone, each bound GPU instance is
    held (a free one of a pinned layout, or one created for the work), each card's mode is the one its work needs.
    The stored layout of every card touched is checked against the geometry: it never holds two overlapping
    instances. Six queries at most."""
    if not plans:
        return
    instances = engine.instances
    bound = [(binding, instances[binding.demand_id]) for binding in bindings if binding.demand_id in instances]
    allocations = {
        a.request_id: a
        for a in Allocation.objects.filter(
            request_id__in=[int(binding.demand_id) for binding, _placed in bound], state="active"
        ).order_by("request_id", "pk")
    }
    touched = {cluster.device_ids[(node, card)] for _demand, node, card in plans}
    doomed = Q()
    for (_demand, node, card), placed in plans.items():
        for instance in placed.destroy:
            doomed |= Q(device_id=cluster.device_ids[(node, card)], start=instance.start)
    if doomed:
        MigInstance.objects.filter(doomed, allocation__isnull=True).delete()
    wanted = {}
    for binding, placed_list in bound:
        for placed in placed_list:
            device_id = cluster.device_ids[(binding.node, placed.card)]
            wanted[(device_id, placed.instance.start)] = (allocations[int(binding.demand_id)], placed)
    rows = list(MigInstance.objects.filter(device_id__in=touched).select_related("profile"))
    existing = {(i.device_id, i.start): i for i in rows}
    devices = Device.objects.filter(pk__in=touched).select_related("model__mig_geometry")
    geometries = {}  # device id -> (catalog geometry, engine geometry)
    for device in devices.prefetch_related("model__mig_geometry__profiles"):
        row = device.model.mig_geometry
        known = next((g for g in geometries.values() if g[0].pk == row.pk), None)
        geometries[device.pk] = known or (row, mig_services.geometry_from_catalog(row))
    profiles = {(d, p.name): p for d, (row, _g) in geometries.items() for p in row.profiles.all()}
    creates, updates = [], []
    for (device_id, start), (allocation, placed) in wanted.items():
        row = existing.get((device_id, start))
        if row is not None and not placed.create:  # a free instance of a pinned layout, or an idle one reused
            row.allocation = allocation
            updates.append(row)
            continue
        creates.append(
            MigInstance(
                device_id=device_id,
                profile=profiles[(device_id, placed.instance.profile)],
                start=start,
                size=placed.instance.size,
                allocation=allocation,
                created_by_scheduler=True,
            )
        )
    _check_layouts(rows, creates, {d: g for d, (_row, g) in geometries.items()})
    MigInstance.objects.bulk_create(creates)
    MigInstance.objects.bulk_update(updates, ["allocation"])
    modes = {}
    for (_demand, node, card), placed in plans.items():
        if placed.mode:
            modes.setdefault(placed.mode == "mig", set()).add(cluster.device_ids[(node, card)])
    for mig_mode, device_ids in modes.items():
        Device.objects.filter(pk__in=device_ids).exclude(mig_mode=mig_mode).update(mig_mode=mig_mode)


def _check_layouts(rows: list[MigInstance], creates: list[MigInstance], geometries: dict[int, mig.Geometry]) -> None:
    """Refuse to store a layout no card could hold (two instances sharing memory slices, one at a start its profile
    does not list, more compute than the card has, a second +me instance): a plan that forgot an instance in the
    way would otherwise be written down as if the card held both. The cycle's transaction is rolled back."""
    layouts: dict[int, list] = {}
    for row in [*rows, *creates]:
        layouts.setdefault(row.device_id, []).append((row.profile.name, row.start, row.size))
    for device_id, layout in layouts.items():
        problems = mig.layout_problems(geometries[device_id], layout)
        if problems:
            raise ValueError(f"device {device_id}: the MIG layout would be {layout}: {'; '.join(problems)}")


def release_instances(allocation_ids: list[int]) -> None:
    """On release: instances made for the work are destroyed, the others of a pinned layout become free."""
    MigInstance.objects.filter(allocation_id__in=allocation_ids, created_by_scheduler=True).delete()
    MigInstance.objects.filter(allocation_id__in=allocation_ids).update(allocation=None)
