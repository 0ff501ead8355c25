"""Reads about allocations that other apps show (through requests.hooks)."""

from scheduling.models import Allocation, AllocationDevice


def allocation_details(request) -> dict | None:
    """The request's latest allocation: node, devices with their shares, times (two queries)."""
    allocation = Allocation.objects.filter(request=request).select_related("node").order_by("-started_at").first()
    if allocation is None:
        return None
    devices = AllocationDevice.objects.filter(allocation=allocation).select_related("device__model")
    return {
        "state": allocation.state, "node": allocation.node.name, "started_at": allocation.started_at,
        "expires_at": allocation.expires_at, "released_at": allocation.released_at,
        "release_reason": allocation.release_reason,
        "devices": [{"index": binding.device.index, "uuid": binding.device.uuid, "model": binding.device.model.name,
                     "milli": binding.milli} for binding in devices],
    }
