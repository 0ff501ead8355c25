"""The scheduling cycle's MIG part: slice demands for MIG-capable models placed geometry-true by `scheduling.mig`.

`plan` takes the cycle's snapshot and demands. Demands for a slice profile of a model with a MIG geometry go to a
`MigEngine` built from the same snapshot (free CPU and memory per node after what runs there), the devices' MIG
mode and GPU instances (held ones are never touched), and the node's layout pin; the others stay with the
milli-share engine, which from then on sees the MIG bindings as running allocations, never places a slice of a
MIG model by milli-share, and never puts a whole card on a MIG-mode card of a pinned node. MIG demands are placed
first in the cycle (they compete with the others only for CPU and memory). `record_instances` writes each bound
GPU instance (a free instance of a pinned layout gets its holder; a new one is created for repartitioning, its
GI/CI ids and MIG UUID filled in by the host driver) after the allocations exist; `release_instances` destroys
created instances and frees the others when allocations are released. Nine queries per cycle whatever the size.
"""

from dataclasses import dataclass, field, replace

from catalog.choices import SpecStatus
from catalog.models import AcceleratorModel, ResourceSpec, SliceProfile
from scheduling import mig, mig_services, placement
from scheduling.models import Allocation, Device, MigInstance


@dataclass
class MigPlan:
    snapshot: placement.Snapshot  # for the milli-share engine: MIG bindings as allocations, MIG slices removed
    demands: list  # the demands left for the milli-share engine
    bindings: list[placement.Binding] = field(default_factory=list)
    pending: list[placement.Pending] = field(default_factory=list)
    instances: dict[str, tuple] = field(default_factory=dict)  # demand id -> ((position, Placed), ...)


def _mig_models() -> dict[str, tuple[AcceleratorModel, mig.Geometry]]:
    models = list(AcceleratorModel.objects.filter(mig_geometry__isnull=False))
    geometries = mig_services.geometries_by_model(models)
    return {m.slug: (m, geometries[m.pk]) for m in models if m.pk in geometries}


def plan(cluster, demands: list[placement.Demand]) -> MigPlan:
    snapshot = cluster.snapshot
    capable = _mig_models()
    if not capable:
        return MigPlan(snapshot, list(demands))
    ours = [d for d in demands if d.slice_profile and d.models and all(m in capable for m in d.models)]
    mig_ids = {d.id for d in ours}
    rest = [d for d in demands if d.id not in mig_ids]
    shares = {
        (p.accelerator.slug, p.name): int(p.compute_fraction * placement.MILLI)
        for p in SliceProfile.objects.filter(accelerator__slug__in=capable).select_related("accelerator")
    }
    by_pk: dict[int, Device] = {
        d.pk: d
        for d in Device.objects.filter(model__slug__in=capable)
        .select_related("node")
        .prefetch_related("mig_instances__profile")
    }
    used_cpu: dict[str, int] = {}
    used_mem: dict[str, int] = {}
    used_milli: dict[tuple[str, int], int] = {}
    for allocation in snapshot.allocations:
        used_cpu[allocation.node] = used_cpu.get(allocation.node, 0) + allocation.cpu_milli
        used_mem[allocation.node] = used_mem.get(allocation.node, 0) + allocation.memory_mib
        for position, milli in allocation.devices:
            key = (allocation.node, position)
            used_milli[key] = used_milli.get(key, 0) + milli
    nodes, engine_nodes = [], []
    for node in snapshot.nodes:
        cards, devices = [], []
        pinned = False
        for device in node.devices:
            row = by_pk.get(cluster.device_ids[(node.name, device.index)])
            busy = used_milli.get((node.name, device.index), 0)
            healthy = device.health == placement.HEALTHY
            if row is None:
                cards.append(mig.Card(device.index, device.model, busy_milli=min(busy, mig.MILLI), healthy=healthy))
                devices.append(device)
                continue
            pinned = row.node.mig_layout_pinned
            instances = tuple(
                mig.Instance(
                    i.profile.name, i.start, i.size, i.gi_id, i.ci_id, i.uuid, busy=i.allocation_id is not None
                )
                for i in row.mig_instances.all()
            )
            held = any(i.busy for i in instances)
            cards.append(
                mig.Card(
                    device.index,
                    device.model,
                    capable[device.model][1],
                    mig=row.mig_mode,
                    instances=instances,
                    pinned=pinned,
                    healthy=healthy,
                    busy_milli=0 if (row.mig_mode or held) else min(busy, mig.MILLI),
                )
            )
            # the milli-share engine: no MIG slices by share; no whole card on a MIG card that cannot change mode
            blocked = row.mig_mode and (pinned or held)
            devices.append(replace(device, slice_profiles={}, capacity=0 if blocked else device.capacity))
        engine_nodes.append(
            mig.MigNode(
                node.name,
                node.cpu_milli - used_cpu.get(node.name, 0),
                node.memory_mib - used_mem.get(node.name, 0),
                tuple(cards),
                node.schedulable,
            )
        )
        nodes.append(replace(node, devices=tuple(devices)))
    result = MigPlan(placement.Snapshot(nodes, snapshot.allocations), rest)
    if not ours:
        return result
    engine = mig.MigEngine(engine_nodes, workload=[*map(_slice_demand, demands), *_offered(capable)], seed=0)
    extra = []
    for demand in ours:
        outcome = engine.place_one(_slice_demand(demand))
        if isinstance(outcome, mig.MigPending):
            result.pending.append(placement.Pending(demand.id, outcome.reason, outcome.message, dict(outcome.numbers)))
            continue
        model = next(iter(demand.models))
        devices = tuple((p.card, shares.get((model, demand.slice_profile), 1)) for p in outcome.placed)
        result.bindings.append(
            placement.Binding(demand.id, outcome.node, devices, outcome.cpu_milli, outcome.memory_mib)
        )
        result.instances[demand.id] = tuple((p.card, p) for p in outcome.placed)
        extra.append(
            placement.Allocation(
                demand.id,
                outcome.node,
                devices,
                outcome.cpu_milli,
                outcome.memory_mib,
                demand.priority,
                demand.preemptible,
            )
        )
    result.snapshot = placement.Snapshot(nodes, (*snapshot.allocations, *extra))
    return result


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


def _slice_demand(demand: placement.Demand) -> mig.SliceDemand:
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


def record_instances(mig_plan: MigPlan, cluster) -> None:
    """Write the GPU instances the MIG bindings hold (the allocations exist now). Three queries."""
    if not mig_plan.instances:
        return
    request_ids = [int(demand_id) for demand_id in mig_plan.instances]
    allocations = {
        a.request_id: a
        for a in Allocation.objects.filter(request_id__in=request_ids, state="active").order_by("request_id", "pk")
    }
    wanted = {}
    for demand_id, placed_list in mig_plan.instances.items():
        binding = next(b for b in mig_plan.bindings if b.demand_id == demand_id)
        for position, placed in placed_list:
            device_id = cluster.device_ids[(binding.node, position)]
            wanted[(device_id, placed.instance.start)] = (allocations[int(demand_id)], placed)
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
