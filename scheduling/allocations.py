"""Device accounting for allocations, the execution backend's binding adopted, and the allocation details other
apps show (through requests.hooks)."""

from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.db.models import Case, Value, When

from config.errors import Conflict
from config.sql import update_from_values
from requests.choices import EventCode
from requests.services import record_event
from scheduling.choices import AllocationState
from scheduling.engine import MILLI, Binding, spread_note
from scheduling.models import Allocation, AllocationDevice, Device, MigInstance, Node


def adjust_device_shares(deltas: dict[int, int]) -> None:
    """Add (or, negative, take back) milli-shares on devices in one statement. The CHECK on allocated_milli
    (0..1000) makes the database refuse any double binding or over-commit, whatever the caller believed."""
    table = Device._meta.db_table
    update_from_values(
        table=table,
        columns=[("id", "bigint"), ("delta", "integer")],
        rows=[(device_id, delta) for device_id, delta in deltas.items() if delta],
        set_sql=f"allocated_milli = {table}.allocated_milli + v.delta",
    )


def allocations_meter_from_workload(*, allocation_ids: list[int]) -> None:
    """Card-hours of these allocations (and of the members of the gangs they lead) count from their workload's start
    on its backend (`workload_started_at`, recorded by `allocations_workload_started`), not from the binding: a job
    that never starts is charged nothing. Called when the platform is about to start work on an execution backend
    (a compute order's provisioning). An advance reservation's are left metered from the binding: its window was
    held for it, used or not (a no-show is metered as reserved)."""
    members = list(_gang_members_led_by(allocation_ids))
    Allocation.objects.filter(pk__in=[*allocation_ids, *members], request__reserved_start__isnull=True).update(
        metered_from_workload=True
    )


@transaction.atomic
def allocations_workload_started(*, started: dict[int, datetime], slurm_jobs: dict[int, int] | None = None) -> None:
    """The backend started each allocation's workload (by allocation id) at that time, and the members of the
    gangs they lead with them; the first report counts (a readiness check run again after a crash does not move it).
    `slurm_jobs`: the Slurm job that runs each of them (by allocation id), recorded on the gang's members too, so
    that metering finds them in Slurm's books. Two statements for the batch, three with jobs, in one transaction
    (one commit to wait for, not one per statement)."""
    if started:
        members = _gang_members_led_by(list(started))
        started = {**started, **{member: started[leader] for member, leader in members.items()}}
        Allocation.objects.filter(pk__in=started, workload_started_at__isnull=True).update(
            workload_started_at=Case(*(When(pk=allocation_id, then=Value(at)) for allocation_id, at in started.items()))
        )
        slurm_jobs = slurm_jobs or {}
        jobs = {
            **slurm_jobs,
            **{member: slurm_jobs[leader] for member, leader in members.items() if leader in slurm_jobs},
        }
        if jobs:
            Allocation.objects.filter(pk__in=jobs, slurm_job_id__isnull=True).update(
                slurm_job_id=Case(*(When(pk=allocation_id, then=Value(job)) for allocation_id, job in jobs.items()))
            )


def _gang_members_led_by(allocation_ids: list[int]) -> dict[int, int]:
    """The other active members of the gangs these allocations lead (member 0), each with its leader (one query):
    the one job of a gang starts on every member's node at once, so the leader's start is theirs."""
    return dict(
        Allocation.objects.filter(
            member__gt=0,
            state=AllocationState.ACTIVE,
            request__allocations__pk__in=allocation_ids,
            request__allocations__member=0,
        ).values_list("pk", "request__allocations__pk")
    )


def allocations_adopt_backend_bindings(*, bound: dict[int, list[int]], backend: str) -> dict[int, dict | Conflict]:
    """The execution backend is the source of truth for which devices inside the node run the work (Slurm binds
    GPU indexes itself): `bound` gives the indexes it bound for each allocation (by id). Where they differ from the
    platform's choice, the allocation is rebound to them, with a note on the request's timeline, in a transaction
    of its own.

    A device the backend gave us that the books show under another active allocation is exchanged with the one we
    leave: the backend cannot have bound one card twice, so that allocation's books were wrong as well (its own
    job's report corrects them again). Returns {"chosen", "bound", "rebound"} for each allocation, or the Conflict
    that says the inventory and the backend disagree about its node.

    Mostly the backend bound what the platform chose: one read for all of them says so, without the nodes' locks
    (which make the reports of one node's allocations take turns) or a transaction."""
    chosen = defaultdict(list)
    rows = AllocationDevice.objects.filter(allocation_id__in=bound).values_list("allocation_id", "device__index")
    for allocation_id, index in rows:
        chosen[allocation_id].append(index)
    adopted = {}
    for allocation_id, indexes in bound.items():
        mine = sorted(chosen[allocation_id])
        if mine == sorted(indexes):
            adopted[allocation_id] = {"chosen": mine, "bound": mine, "rebound": False}
            continue
        try:
            adopted[allocation_id] = _adopt(allocation_id=allocation_id, indexes=indexes, backend=backend)
        except Conflict as mismatch:
            adopted[allocation_id] = mismatch
    return adopted


@transaction.atomic
def _adopt(*, allocation_id: int, indexes: list[int], backend: str) -> dict:
    # The node's row first: rebinds on one node take turns, so two of them exchanging devices cannot deadlock.
    Node.objects.select_for_update(of=("self",)).filter(allocations__pk=allocation_id).values_list("pk").get()
    allocation = Allocation.objects.select_for_update(of=("self",)).select_related("request").get(pk=allocation_id)
    rows = list(AllocationDevice.objects.select_for_update().filter(allocation=allocation).select_related("device"))
    chosen, bound = sorted(row.device.index for row in rows), sorted(indexes)
    if chosen == bound or allocation.state != AllocationState.ACTIVE:
        return {"chosen": chosen, "bound": bound, "rebound": False}
    devices = {
        device.index: device
        for device in Device.objects.select_for_update()
        .filter(node_id=allocation.node_id, index__in=bound)
        .order_by("pk")
    }
    if len(bound) != len(rows) or len(devices) != len(bound):
        raise Conflict(
            f"{backend} bound devices {bound} where the allocation holds {chosen}; the inventory and the backend "
            "disagree about the node.",
            code="backend_binding_mismatch",
            details={"chosen": chosen, "bound": bound},
        )
    deltas = defaultdict(int)
    left = [row for row in rows if row.device.index not in bound]
    gained = [devices[index] for index in bound if index not in chosen]
    for row, device in zip(left, gained, strict=True):
        _exchange(allocation, row, device, deltas)
    adjust_device_shares(deltas)
    record_event(
        request=allocation.request,
        actor=None,
        code=EventCode.DEVICES_REBOUND,
        message=f"{backend} bound device index(es) {_listed(bound)} on the node where the platform chose "
        f"{_listed(chosen)}: the allocation follows {backend}.",
        data={"backend": backend, "chosen": chosen, "bound": bound},
    )
    return {"chosen": chosen, "bound": bound, "rebound": True}


def _exchange(allocation: Allocation, row: AllocationDevice, device: Device, deltas: dict[int, int]) -> None:
    """Move our binding `row` onto `device`, and whoever else the books put on `device` onto the one we leave."""
    left = row.device_id
    for other in (
        AllocationDevice.objects.select_for_update()
        .filter(device=device, allocation__state=AllocationState.ACTIVE)
        .exclude(allocation=allocation)
    ):
        other.device_id = left
        other.save(update_fields=["device"])
        deltas[device.pk] -= other.milli
        deltas[left] += other.milli
    row.device = device
    row.save(update_fields=["device"])
    deltas[left] -= row.milli
    deltas[device.pk] += row.milli


def _listed(indexes: list[int]) -> str:
    return ", ".join(str(index) for index in indexes)


def allocation_details(request) -> dict | None:
    """The request's latest allocation: node, devices with their shares and MIG instances, times (three queries).
    A serving request's replicas, and a multi-node gang's members, each hold one: then all of them that were bound
    (or released) together, each replica (member) with its node and devices, and a note when replicas share a
    node."""
    latest = Allocation.objects.filter(request=request).select_related("node").order_by("-started_at").first()
    if latest is None:
        return None
    latest.request = request  # its term's end reads the request's duration: the caller's row, not the row joined again
    part = "replica" if latest.replica is not None else "member" if latest.member is not None else None
    together = (
        [latest]
        if part is None
        else list(
            Allocation.objects.filter(
                request=request, **{f"{part}__isnull": False}, state=latest.state, released_at=latest.released_at
            )
            .select_related("node")
            .order_by(part)
        )
    )
    devices = _devices_of(together)
    details = {
        "state": latest.state,
        "node": together[0].node.name,
        "started_at": latest.started_at,
        "expires_at": latest.expires_at,
        "released_at": latest.released_at,
        "release_reason": latest.release_reason,
        "devices": [device for allocation in together for device in devices[allocation.pk]],
    }
    if part == "member":
        members = [
            {"member": allocation.member, "node": allocation.node.name, "devices": devices[allocation.pk]}
            for allocation in together
        ]
        return {**details, "nodes": [member["node"] for member in members], "members": members}
    if part is None:
        return details
    replicas = [
        {"replica": allocation.replica, "node": allocation.node.name, "devices": devices[allocation.pk]}
        for allocation in together
    ]
    spread = spread_note([Binding(str(request.pk), r["node"], (), 0, 0, r["replica"]) for r in replicas])
    return {**details, "nodes": [r["node"] for r in replicas], "replicas": replicas, "spread": spread}


def _devices_of(allocations: list[Allocation]) -> dict[int, list[dict]]:
    """Each allocation's devices with their shares and MIG instances (one query, two when a card is sliced: only
    a card in MIG mode or a share of one holds instances, as provisioning's targets read them)."""
    bindings = list(
        AllocationDevice.objects.filter(allocation__in=allocations)
        # Each allocation's cards in index order (the default order sorts by the allocations' start: a join more)
        .order_by("allocation_id", "device__index")
        .values(
            "allocation_id",
            "device_id",
            "milli",
            "device__index",
            "device__uuid",
            "device__mig_mode",
            "device__model__name",
        )
    )
    sliced = any(binding["device__mig_mode"] or binding["milli"] < MILLI for binding in bindings)
    instances = _mig_instances_of(allocations) if sliced else {}
    devices: dict[int, list[dict]] = {allocation.pk: [] for allocation in allocations}
    for binding in bindings:
        devices[binding["allocation_id"]].append(
            {
                "index": binding["device__index"],
                "uuid": binding["device__uuid"],
                "model": binding["device__model__name"],
                "milli": binding["milli"],
                "mig_instance": instances.get((binding["allocation_id"], binding["device_id"])),
            }
        )
    return devices


def _mig_instances_of(allocations: list[Allocation]) -> dict[tuple[int, int], dict]:
    return {
        (i.allocation_id, i.device_id): {
            "profile": i.profile.name,
            "start": i.start,
            "size": i.size,
            "gi_id": i.gi_id,
            "ci_id": i.ci_id,
            "uuid": i.uuid,
            "created_for_it": i.created_by_scheduler,
        }
        for i in MigInstance.objects.filter(allocation__in=allocations).select_related("profile")
    }
