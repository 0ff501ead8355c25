"""Never fits: a demand that no node of the inventory could hold even empty (`no_matching_spec`), told apart from
one that waits. No database, no state: rooms are worked out from the inventory alone."""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.engine.model import NO_MATCHING_SPEC, Demand, DeviceView, NodeView, Pending
from scheduling.engine.words import in_units


class NeverFits:
    """`unplaceable` over one inventory; the rooms are worked out once per kind of device asked for (the inventory
    does not change while an engine lives, and its forks share this)."""

    def __init__(self, nodes: Sequence[NodeView]):
        self.nodes = nodes
        self._rooms: dict = {}

    def check(self, demand: Demand) -> Pending | None:
        key = (demand.models, demand.slice_profile, demand.share, demand.needs)
        if key not in self._rooms:
            self._rooms[key] = _rooms(self.nodes, demand)
        return _never_fits(self._rooms[key], demand)


def unplaceable(nodes: Sequence[NodeView], demand: Demand) -> Pending | None:
    """`no_matching_spec` when no node of the inventory could hold the demand even empty;
    None when one could.

    Every node counts, cordoned ones and isolated or unhealthy devices included: they can come back, so they make a
    demand wait (`insufficient_healthy_capacity`), never "never fits". The reason names the blocking dimension and
    the largest node: compatible devices first, then cores among the nodes with enough devices, then memory among
    those with enough devices and cores. No database.
    """
    return _never_fits(_rooms(nodes, demand), demand)


def _rooms(nodes: Sequence[NodeView], demand: Demand) -> list[tuple[int, int, int, int, str]]:
    """What an empty node offers the demand's kind of device: (devices that could take a share, cores in milli,
    memory in MiB, devices of the wanted models, node name), once per distinct size (its first node by inventory
    order), so that an inventory of thousands of nodes of a few types is a few rooms."""
    rooms: dict[tuple, str] = {}
    for node in nodes:
        if not demand.needs <= node.capabilities:
            continue
        size = (
            sum(1 for device in node.devices if _could_hold(device, demand)),
            node.cpu_milli,
            node.memory_mib,
            sum(1 for device in node.devices if _of_model(device, demand)),
        )
        rooms.setdefault(size, node.name)
    return [(*size, name) for size, name in rooms.items()]


def _never_fits(rooms, demand: Demand) -> Pending | None:
    wanted = "/".join(sorted(demand.models)) or "accelerator"
    if demand.needs and not rooms:
        return Pending(
            demand.id,
            NO_MATCHING_SPEC,
            f"needs {demand.label} on a node with {demand.needs_words}; no node of the inventory has it, so it "
            "cannot run here",
            {"dimension": "runtime", "needs": sorted(demand.needs), "nodes": 0},
        )
    if demand.count and not any(room[3] for room in rooms):
        return Pending(
            demand.id,
            NO_MATCHING_SPEC,
            f"needs {demand.label}; no {wanted} device exists in the cluster"
            if not demand.needs
            else f"needs {demand.label} on a node with {demand.needs_words}; no such node has a {wanted} device, so "
            "it cannot run here",
            {"needed": demand.count, "devices": 0},
        )
    kind = f"{wanted} devices" + (f" with {demand.slice_profile} slices" if demand.slice_profile else "")
    dimensions = (
        ("devices", demand.count, 1, kind),
        ("cpu_cores", demand.cpu_milli, 1000, "cores"),
        ("memory_gib", demand.memory_mib, 1024, "GiB of memory"),
    )
    for position, (dimension, needed, unit, what) in enumerate(dimensions):
        holding = [room for room in rooms if room[position] >= needed]
        if holding:
            rooms = holding
            continue
        largest = max(rooms, key=lambda room: room[position])  # the first such node in inventory order
        numbers = {
            "dimension": dimension,
            "needed": in_units(needed, unit),
            "largest": in_units(largest[position], unit),
            "node": largest[4],
        }
        return Pending(
            demand.id,
            NO_MATCHING_SPEC,
            f"needs {demand.label} with {in_units(demand.cpu_milli, 1000)} cores and "
            f"{in_units(demand.memory_mib, 1024)} GiB on one node; no node has {numbers['needed']} "
            f"{what}: the largest {wanted} node has {numbers['largest']} ({largest[4]}), so it can "
            f"never run on this inventory",
            numbers,
        )
    return None


def _of_model(device: DeviceView, demand: Demand) -> bool:
    return not demand.models or device.model in demand.models


def _could_hold(device: DeviceView, demand: Demand) -> bool:
    """Whether the device, free, could take one of the demand's shares (whatever its health now)."""
    share = device.slice_profiles.get(demand.slice_profile) if demand.slice_profile else demand.share
    return _of_model(device, demand) and share is not None and share <= device.capacity
