"""Device accounting for allocations, the execution backend's binding adopted, and the allocation details other
apps show (through requests.hooks)."""

from collections import defaultdict

from django.db import transaction

from config.errors import Conflict
from config.sql import update_from_values
from requests.choices import EventCode
from requests.services import record_event
from scheduling.choices import AllocationState
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


def allocation_adopt_backend_binding(*, allocation_id: int, indexes: list[int], backend: str) -> dict:
    """The execution backend is the source of truth for which devices inside the node run the work (Slurm binds
    GPU indexes itself): when the indexes it bound differ from the platform's choice, the allocation is rebound to
    them, with a note on the request's timeline, in this one transaction.

    A device the backend gave us that the books show under another active allocation is exchanged with the one we
    leave: the backend cannot have bound one card twice, so that allocation's books were wrong as well (its own
    job's report corrects them again). Returns {"chosen", "bound", "rebound"}.

    Mostly the backend bound what the platform chose: one read says so, without the node's lock (which makes the
    reports of one node's allocations take turns) or a transaction."""
    chosen = sorted(
        AllocationDevice.objects.filter(allocation_id=allocation_id).values_list("device__index", flat=True)
    )
    if chosen == sorted(indexes):
        return {"chosen": chosen, "bound": chosen, "rebound": False}
    return _adopt(allocation_id=allocation_id, indexes=indexes, backend=backend)


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
        allocation.request,
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
    """The request's latest allocation: node, devices with their shares and MIG instances, times (three queries)."""
    allocation = (
        Allocation.objects.filter(request=request).select_related("node", "request").order_by("-started_at").first()
    )
    if allocation is None:
        return None
    devices = AllocationDevice.objects.filter(allocation=allocation).select_related("device__model")
    instances = {
        i.device_id: {
            "profile": i.profile.name,
            "start": i.start,
            "size": i.size,
            "gi_id": i.gi_id,
            "ci_id": i.ci_id,
            "uuid": i.uuid,
            "created_for_it": i.created_by_scheduler,
        }
        for i in MigInstance.objects.filter(allocation=allocation).select_related("profile")
    }
    return {
        "state": allocation.state,
        "node": allocation.node.name,
        "started_at": allocation.started_at,
        "expires_at": allocation.expires_at,
        "released_at": allocation.released_at,
        "release_reason": allocation.release_reason,
        "devices": [
            {
                "index": binding.device.index,
                "uuid": binding.device.uuid,
                "model": binding.device.model.name,
                "milli": binding.milli,
                "mig_instance": instances.get(binding.device_id),
            }
            for binding in devices
        ],
    }
