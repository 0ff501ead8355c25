"""Device accounting for allocations, and the allocation details other apps show (through requests.hooks)."""

from config.sql import update_from_values
from scheduling.models import Allocation, AllocationDevice, Device


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


def allocation_details(request) -> dict | None:
    """The request's latest allocation: node, devices with their shares, times (two queries)."""
    allocation = (
        Allocation.objects.filter(request=request).select_related("node", "request").order_by("-started_at").first()
    )
    if allocation is None:
        return None
    devices = AllocationDevice.objects.filter(allocation=allocation).select_related("device__model")
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
            }
            for binding in devices
        ],
    }
