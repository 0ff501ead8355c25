"""The last cycle's outcome, kept for the order preview: the cycle writes it in its own transaction (one row),
the preview reads it back as placement engine state in one query, however long the queue is.

The row holds each node with its devices (each make of node written once) and what is in use on it once the cycle
committed (running allocations plus the bindings it made), summed per node: the engine only needs free capacity to
place one more demand.
Each process builds the engine state once per outcome; every preview places on a fork of it, so a preview costs
what it places, not the size of the cluster, and leaves the state as the cycle left it for the next one.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from scheduling.engine import Demand, DeviceView, NodeView, PlacementEngine, RunningAllocation, Snapshot
from scheduling.engine.policies import make_policy
from scheduling.models import CycleOutcome

# Engines tuned to an order's shape kept per outcome: orders come in a few catalog shapes; more are built again.
MAX_TUNED_ENGINES = 32


@dataclass(frozen=True)
class Outcome:
    finished_at: datetime
    engine: PlacementEngine  # frozen, as the cycle ended: previews place on forks of it
    reservation: dict | None  # {"request_id", "node", "start"} of the head-of-line hold
    waiting: dict[str, int]  # requests the cycle left queued, per priority class
    forecast: dict  # what expected starts are replayed from (scheduling.forecasting.Inputs, stored)
    _tuned: dict = field(default_factory=dict, compare=False, repr=False)  # by the shape its policy learnt

    def engine_for(self, demand: Demand) -> PlacementEngine:
        """A fresh engine at the cycle's end state to place on, its policy learnt from the demand alone (what a
        preview of it places by); building it costs O(cluster) once per shape, each call after that a fork."""
        shape = (demand.cpu_milli, demand.memory_mib, demand.count, demand.share, demand.models)
        tuned = self._tuned.get(shape)
        if tuned is None:
            if len(self._tuned) >= MAX_TUNED_ENGINES:
                self._tuned.pop(next(iter(self._tuned)), None)  # the oldest
            tuned = self._tuned[shape] = self.engine.fork(workload=[demand])
        return tuned.fork()


def record_outcome(*, snapshot: Snapshot, bindings, reservation, waiting, forecast: dict, now: datetime) -> None:
    """Store what the engine would start the next preview from, how many of the requests it left `waiting` are in
    each priority class and what expected starts of new work are replayed from (`forecast`), in one upsert."""
    row = CycleOutcome(
        pk=CycleOutcome.SINGLETON,
        finished_at=now,
        nodes=_in_use(snapshot, bindings),
        reservation=None
        if reservation is None
        else {
            "request_id": reservation.request_id,
            "node": reservation.node,
            "nodes": list(reservation.held),
            "start": reservation.start.isoformat(),
        },
        waiting=dict(Counter(request.priority for request in waiting)),
        forecast=forecast,
    )
    # INSERT ... ON CONFLICT: one statement whether or not a cycle wrote the row before.
    CycleOutcome.objects.bulk_create(
        [row],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["finished_at", "nodes", "reservation", "waiting", "forecast"],
    )


_decoded: dict[datetime, "Outcome"] = {}  # the last outcome this process read, by the time of its cycle


def last_outcome() -> Outcome | None:
    """The last cycle's outcome as an engine snapshot. Decoding a thousand-node row costs more than the preview
    itself, so each process keeps the one it decoded last and reads only the cycle's time while it is current."""
    finished_at = CycleOutcome.objects.filter(pk=CycleOutcome.SINGLETON).values_list("finished_at", flat=True).first()
    if finished_at is None:
        return None
    if finished_at not in _decoded:
        row = CycleOutcome.objects.filter(pk=CycleOutcome.SINGLETON).first()
        if row is None:  # deleted in between
            return None
        _decoded.clear()
        _decoded[finished_at] = _decode(row)  # a cycle that wrote in between is read on the next call
    return _decoded[finished_at]


def _decode(row: CycleOutcome) -> Outcome:
    kinds = [
        (
            cpu_milli,
            memory_mib,
            schedulable,
            tuple(DeviceView(i, *device[:5], slice_profiles=device[5]) for i, device in enumerate(devices)),
            frozenset(capabilities[0] if capabilities else ()),  # none in a row written before nodes had them
        )
        for cpu_milli, memory_mib, schedulable, devices, *capabilities in row.nodes["kinds"]
    ]
    nodes, used = [], []
    for name, kind, cpu, memory, devices, *where in row.nodes["nodes"]:
        cpu_milli, memory_mib, schedulable, engine_devices, capabilities = kinds[kind]
        # None in a row written before gangs had domains; no backend in one written before gangs kept to one.
        site, block, rack, *backend = where[0] if where else ("", "", "")
        nodes.append(
            NodeView(
                name,
                cpu_milli,
                memory_mib,
                engine_devices,
                schedulable=schedulable,
                capabilities=capabilities,
                site=site,
                block=block,
                rack=rack,
                backend=backend[0] if backend else "",
            )
        )
        if cpu or memory or devices:
            used.append(RunningAllocation(f"in-use:{name}", name, tuple(map(tuple, devices)), cpu, memory))
    # No policy: every preview forks it with the one its order places by.
    engine = PlacementEngine(Snapshot(nodes, used), policy=make_policy("default", ()))
    return Outcome(row.finished_at, engine, row.reservation, row.waiting, row.forecast)


def _in_use(snapshot: Snapshot, bindings) -> dict:
    """{"kinds": each distinct node make once (cores, memory, schedulable, its devices, its capabilities), "nodes":
    per node its name, kind, what is in use on it (cores, memory, per device index the milli taken) and its site, block,
    rack and execution backend}. A fleet is a
    few makes of node, so the inventory is written once per make, not once per node (62,120 devices at 10x the openb
    fleet)."""
    cpu, memory, shares = {}, {}, {}
    for held in [*snapshot.allocations, *bindings]:
        cpu[held.node] = cpu.get(held.node, 0) + held.cpu_milli
        memory[held.node] = memory.get(held.node, 0) + held.memory_mib
        on_node = shares.setdefault(held.node, {})
        for index, milli in held.devices:
            on_node[index] = on_node.get(index, 0) + milli
    kinds: dict[tuple, int] = {}
    makes, nodes = [], []
    for node in snapshot.nodes:
        # The snapshot interns its devices (equal devices are one object), so identity finds the makes; an equal
        # device that is another object only makes one more kind.
        key = (node.cpu_milli, node.memory_mib, node.schedulable, tuple(map(id, node.devices)), node.capabilities)
        kind = kinds.get(key)
        if kind is None:
            kind = kinds[key] = len(makes)
            makes.append(
                [
                    node.cpu_milli,
                    node.memory_mib,
                    node.schedulable,
                    [
                        [
                            device.model,
                            device.vendor,
                            device.memory_mib,
                            device.capacity,
                            device.health,
                            dict(device.slice_profiles),
                        ]
                        for device in node.devices
                    ],
                    sorted(node.capabilities),
                ]
            )
        nodes.append(
            [
                node.name,
                kind,
                cpu.get(node.name, 0),
                memory.get(node.name, 0),
                sorted(shares.get(node.name, {}).items()),
                # Where it sits and what runs its work: a gang's preview chooses domains (of one backend) as the cycle
                [node.site, node.block, node.rack, node.backend],
            ]
        )
    return {"kinds": makes, "nodes": nodes}
