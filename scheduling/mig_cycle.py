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
the freed memory slices must form a valid placement). `record_instances` writes each bound GPU instance (a free
instance of a pinned layout gets its holder; a new one is created for repartitioning, its GI/CI ids and MIG UUID
filled in by the host driver) after the allocations exist; `release_instances` destroys created instances and
frees the others when allocations are released. A fixed number of queries per cycle whatever the size.
"""

from collections.abc import Callable, Iterable
from dataclasses import replace

from django.db.models import Prefetch

from catalog.choices import SpecStatus
from catalog.models import AcceleratorModel, ResourceSpec, SliceProfile
from scheduling import mig, mig_services, placement
from scheduling.models import Allocation, Device, MigInstance


class CycleEngine:
    """The milli-share engine and, when the catalog has MIG-capable models, the MIG engine, as one engine with
    `fits`, `place_one` and `place` (demands in the given order, `placement.place_in_order`)."""

    def __init__(self, milli: placement.PlacementEngine, mig_engine=None, capable=(), shares=None, holdings=()):
        self.start = milli  # the cycle's start state, frozen from here: `at_start` and the placing engine fork it
        self.milli = milli.fork()
        self.mig = mig_engine
        self.capable = frozenset(capable)
        self.shares = shares or {}  # (model, profile) -> the milli-share the record keeps for a slice
        self.holdings = list(holdings)  # running work as the MIG engine sees it, for preemption
        self.instances: dict[str, tuple[mig.Placed, ...]] = {}  # demand id -> the GPU instances bound for it
        self.closed: list[str] = []  # nodes closed to this cycle's placements (close_node), at_start's too

    def at_start(self, running: Iterable[placement.Allocation]) -> placement.PlacementEngine:
        """A milli-share engine at the state the cycle started from plus `running` (bindings of this cycle, as
        allocations): what the head's reservation and preemption planning work on. A fork, so the shape indexes
        scored on the start state are copied and refreshed for the nodes that changed, not scored again; the same
        state and policy as an engine built over the cycle's snapshot and `running`, so the same answers."""
        engine = self.start.fork()
        for name in self.closed:
            engine.close_node(name)
        engine.hold(running)
        return engine

    def is_mig(self, demand: placement.Demand) -> bool:
        return self.mig is not None and is_mig_demand(demand, self.capable)

    def fits(self, demand: placement.Demand) -> bool:
        return self.mig.fits(slice_demand(demand)) if self.is_mig(demand) else self.milli.fits(demand)

    def fits_now(self, demand: placement.Demand, known: dict) -> bool:
        """`fits` where only yes or no matters (see PlacementEngine.fits_now)."""
        return self.mig.fits(slice_demand(demand)) if self.is_mig(demand) else self.milli.fits_now(demand, known)

    def place(self, demands: Iterable[placement.Demand], backfill: bool = False) -> placement.PlacementResult:
        return placement.place_in_order(self, list(demands), backfill)

    def place_one(self, demand: placement.Demand) -> list[placement.Binding] | placement.Pending:
        if self.is_mig(demand):
            return self._place_slice(demand)
        outcome = self.milli.place_one(demand)
        if self.mig is not None and not isinstance(outcome, placement.Pending):
            for binding in outcome:
                self.mig.take(binding.node, binding.devices, binding.cpu_milli, binding.memory_mib)
        return outcome

    def _place_slice(self, demand: placement.Demand) -> list[placement.Binding] | placement.Pending:
        outcome = self.mig.place_one(slice_demand(demand))
        if isinstance(outcome, mig.MigPending):
            return placement.Pending(demand.id, outcome.reason, outcome.message, dict(outcome.numbers))
        share = self.shares.get((next(iter(demand.models)), demand.slice_profile), 1)
        devices = tuple((p.card, share) for p in outcome.placed)
        self.milli.take(outcome.node, [p.card for p in outcome.placed], outcome.cpu_milli, outcome.memory_mib)
        self.instances[demand.id] = outcome.placed
        return [placement.Binding(demand.id, outcome.node, devices, outcome.cpu_milli, outcome.memory_mib)]

    def close_node(self, name: str) -> None:
        """No new work on this node (the preview keeps an order off a node reserved for the queue's head; the cycle
        keeps work off the nodes of a backend that does not answer)."""
        self.closed.append(name)
        self.milli.close_node(name)
        if self.mig is not None:
            self.mig.close_node(name)

    def plan_preemption(self, demand: placement.Demand, may_evict: Callable[[str], bool]) -> mig.MigPreemptionPlan:
        """Victims for a waiting slice among the running work of lower priority that `may_evict` allows."""
        candidates = [h for h in self.holdings if h.priority < demand.priority and may_evict(h.id)]
        return self.mig.plan_preemption(slice_demand(demand), candidates)


def is_mig_demand(demand: placement.Demand, capable: Iterable[str]) -> bool:
    """A slice of MIG-capable models only: placed geometry-true."""
    return bool(demand.slice_profile and demand.models) and all(model in capable for model in demand.models)


def placed_geometry_true(demand: placement.Demand) -> bool:
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
    demands: list[placement.Demand],
    policy: str = "default",
    milli_engine: Callable[[placement.Snapshot], placement.PlacementEngine] | None = None,
) -> CycleEngine:
    """The engines for the cycle's snapshot; ``demands`` are the workload both learn their scores from.
    ``milli_engine(snapshot)`` gives the milli-share engine's start state (the scheduler's kept engine); without
    it one is built over the snapshot."""
    milli_engine = milli_engine or (lambda snapshot: placement.PlacementEngine(snapshot, policy, workload=demands))
    snapshot = cluster.snapshot
    capable = mig_capable_models()
    if not capable:
        return CycleEngine(milli_engine(snapshot))
    shares = {
        (p.accelerator.slug, p.name): int(p.compute_fraction * placement.MILLI)
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
    milli_snapshot = placement.Snapshot([node for _mig_node, node in pairs], snapshot.allocations)
    mig_engine = mig.MigEngine(engine_nodes, workload=[*map(slice_demand, demands), *_offered(capable)], seed=0)
    return CycleEngine(
        milli_engine(milli_snapshot),
        mig_engine,
        capable,
        shares,
        inventory.holdings(snapshot.allocations),
    )


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

    def node(self, node: placement.Node) -> tuple[mig.MigNode, placement.Node]:
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

    def _card(self, node: str, device: placement.Device) -> tuple[mig.Card, placement.Device]:
        row = self.row(node, device.index)
        busy = self.used_milli.get((node, device.index), 0)
        healthy = device.health == placement.HEALTHY
        if row is None:
            return mig.Card(device.index, device.model, busy_milli=min(busy, mig.MILLI), healthy=healthy), device
        pinned = row.node.mig_layout_pinned
        instances = tuple(_instance(i) for i in row.mig_instances.all())
        held = any(i.busy for i in instances)
        # Work without a GPU instance on a MIG-mode card holds the whole card: as if in whole mode, taken.
        whole_work = busy and not held
        card = mig.Card(
            device.index,
            device.model,
            self.capable[device.model][1],
            mig=row.mig_mode and not whole_work,
            instances=instances,
            pinned=pinned,
            healthy=healthy,
            busy_milli=min(busy, mig.MILLI) if whole_work else 0,
        )
        blocked = row.mig_mode and (pinned or held)  # no whole card on a MIG card that cannot change mode
        return card, replace(device, slice_profiles={}, capacity=0 if blocked else device.capacity)

    def holdings(self, allocations: Iterable[placement.Allocation]) -> list[mig.Holding]:
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


def slice_demand(demand: placement.Demand) -> mig.SliceDemand:
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


def record_instances(instances: dict[str, tuple[mig.Placed, ...]], bindings, cluster) -> None:
    """Write the GPU instances the committed MIG bindings hold (the allocations exist now). Three queries."""
    bound = [(binding, instances[binding.demand_id]) for binding in bindings if binding.demand_id in instances]
    if not bound:
        return
    allocations = {
        a.request_id: a
        for a in Allocation.objects.filter(
            request_id__in=[int(binding.demand_id) for binding, _placed in bound], state="active"
        ).order_by("request_id", "pk")
    }
    wanted = {}
    for binding, placed_list in bound:
        for placed in placed_list:
            device_id = cluster.device_ids[(binding.node, placed.card)]
            wanted[(device_id, placed.instance.start)] = (allocations[int(binding.demand_id)], placed)
    existing = {
        (i.device_id, i.start): i
        for i in MigInstance.objects.filter(device_id__in={d for d, _ in wanted}).select_related("profile")
    }
    profiles = {
        (d.pk, p.name): p
        for d in Device.objects.filter(pk__in={d for d, _ in wanted}).prefetch_related("model__mig_geometry__profiles")
        for p in d.model.mig_geometry.profiles.all()
    }
    creates, updates = [], []
    for (device_id, start), (allocation, placed) in wanted.items():
        row = existing.get((device_id, start))
        if row is not None and not placed.create:
            row.allocation = allocation
            updates.append(row)
            continue
        if row is not None:  # an idle instance of a repartitionable card is destroyed and made again
            row.delete()
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
    MigInstance.objects.bulk_create(creates)
    MigInstance.objects.bulk_update(updates, ["allocation"])
    Device.objects.filter(pk__in={d for d, _ in wanted}, mig_mode=False).update(mig_mode=True)


def release_instances(allocation_ids: list[int]) -> None:
    """On release: instances made for the work are destroyed, the others of a pinned layout become free."""
    MigInstance.objects.filter(allocation_id__in=allocation_ids, created_by_scheduler=True).delete()
    MigInstance.objects.filter(allocation_id__in=allocation_ids).update(allocation=None)
