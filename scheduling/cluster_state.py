"""The engine's cluster state kept in the scheduler process between cycles, brought up to date from the change log.

A cycle used to read every node, device and running allocation (60,000 devices at 12,000 nodes) and rebuild the
engine's objects from them. Now the process keeps what it read last, by primary key, and each cycle re-reads only
the nodes and allocations the change log names (triggers write it: migration 0020), in a fixed number of queries.

Why it stays right:
- *The cursor is a transaction horizon, not an id.* Log rows are read from every transaction not known finished at
  the last read (`xid >= xmin` of that read's snapshot), so a transaction that took a low id and committed late is
  still seen; rows are re-read, never applied twice (a change is "read the current row again").
- *A missed delta forces a rebuild.* The log's newest id going backwards (rolled back or truncated), a cursor older
  than the log keeps rows for, a change to the slice tables (`all`), a checksum of the running allocations and the
  inventory that disagrees with what the deltas left, or the last cycle's transaction not having committed (its
  own writes were read inside it): each means the whole cluster is read again.
- *And a periodic one*: every `SCHEDULER_STATE_REBUILD_CYCLES` catch-ups the cluster is read whole and compared; a
  difference is logged as drift (`cluster_state_drift` in the log) and the fresh state kept.

On SQLite (the demo) there is no log: every catch-up is a full read, as before.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from catalog.models import SliceProfile
from catalog.runtimes import capabilities_of
from scheduling.backends import node_capabilities
from scheduling.choices import AllocationState, DeviceHealth
from scheduling.engine import DEGRADED, HEALTHY, ISOLATED, MILLI, DeviceView, NodeView, RunningAllocation, Snapshot
from scheduling.models import ENDS_AT, UNPLACED_RACK, Allocation, AllocationDevice, Device, Node

logger = logging.getLogger(__name__)

LOG = "scheduling_cluster_change"
KEEP_LOG = timedelta(hours=1)  # rows older than this are pruned; a cursor older than half of it rebuilds
CHECKSUM_SQL = (
    "(SELECT count(*) FROM scheduling_allocation WHERE state = %s), "
    "(SELECT coalesce(sum(id), 0) FROM scheduling_allocation WHERE state = %s), "
    "(SELECT count(*) FROM scheduling_node), (SELECT count(*) FROM scheduling_device)"
)


@dataclass(frozen=True)
class _NodeEntry:
    node: NodeView
    device_pks: tuple[int, ...]  # by engine position


@dataclass(frozen=True)
class _AllocationEntry:
    pk: int
    request_id: int
    node_pk: int
    shares: tuple[tuple[int, int], ...]  # (device pk, milli), sorted
    cpu_milli: int
    memory_mib: int
    priority: int
    preemptible: bool
    started_at: datetime
    ends_at: datetime


def _read_profiles() -> dict[int, dict[str, int]]:
    profiles: dict[int, dict[str, int]] = {}
    for accelerator_id, name, fraction in SliceProfile.objects.values_list(
        "accelerator_id", "name", "compute_fraction"
    ):
        profiles.setdefault(accelerator_id, {})[name] = int(fraction * MILLI)
    return profiles


def engine_health(isolated: bool, health: str) -> str:
    if isolated or health == DeviceHealth.UNHEALTHY:
        return ISOLATED
    return DEGRADED if health == DeviceHealth.DEGRADED else HEALTHY


class ClusterState:
    """Rows as the engine needs them, by primary key; `view()` gives the engine snapshot and the way back to rows."""

    def __init__(self):
        self.nodes: dict[int, _NodeEntry] = {}
        self.allocations: dict[int, _AllocationEntry] = {}
        self._profiles: dict[int, dict[str, int]] = {}
        self._interned: dict[tuple, DeviceView] = {}  # equal devices are one frozen object
        self._view = None

    # -- reading rows --------------------------------------------------------------------------------------------

    def read_all(self) -> None:
        """Everything, in five queries."""
        self.read_inventory()
        self.allocations = self._read_allocations(None)

    def read_inventory(self) -> None:
        """The slice tables, nodes and devices (three queries); no allocations."""
        self._profiles = _read_profiles()
        self.nodes, self._view = self._read_nodes(None), None

    def catalog_changed(self) -> bool:
        """Whether the slice tables differ from the ones the devices were built with (one query). Model slugs and
        vendors are read with every device, so a device read again shows them; the rebuild covers the rest."""
        return _read_profiles() != self._profiles

    def reread(self, *, node_pks: set[int], allocation_pks: set[int]) -> None:
        """The named nodes and allocations again (gone ones dropped), in at most four queries."""
        if node_pks:
            fresh = self._read_nodes(node_pks)
            for pk in node_pks:
                if pk in fresh:
                    self.nodes[pk] = fresh[pk]
                else:
                    self.nodes.pop(pk, None)
        if allocation_pks:
            fresh = self._read_allocations(allocation_pks)
            for pk in allocation_pks:
                if pk in fresh:
                    self.allocations[pk] = fresh[pk]
                else:
                    self.allocations.pop(pk, None)
        if node_pks or allocation_pks:
            self._view = None

    def _read_nodes(self, pks: set[int] | None) -> dict[int, _NodeEntry]:
        devices, nodes = Device.objects.all(), Node.objects.all()
        if pks is not None:
            devices, nodes = devices.filter(node_id__in=pks), nodes.filter(pk__in=pks)
        by_node: dict[int, list[tuple]] = {}
        for row in devices.order_by("node_id", "index").values_list(
            "pk", "node_id", "model_id", "model__slug", "model__vendor__slug", "memory_gb", "health", "isolated"
        ):
            by_node.setdefault(row[1], []).append(row)
        entries = {}
        node_rows = nodes.values_list(
            *("pk", "name", "cpu_milli", "memory_mib", "schedulable", "serving_runtimes", "execution_backend"),
            *("rack__site__name", "rack__block__name", "rack__name"),  # where it sits, for multi-node gangs
        )
        for node_pk, name, cpu_milli, memory_mib, schedulable, runtimes, backend, site, block, rack in node_rows:
            rows = by_node.get(node_pk, [])
            engine_devices = tuple(self._device(position, row) for position, row in enumerate(rows))
            node = NodeView(
                name,
                cpu_milli,
                memory_mib,
                engine_devices,
                schedulable=schedulable,
                capabilities=capabilities_of(runtimes) | node_capabilities(backend),
                site=site or "",
                block=block or "",
                rack="" if rack in (None, UNPLACED_RACK) else rack,
                backend=backend,
            )
            entries[node_pk] = _NodeEntry(node, tuple(row[0] for row in rows))
        return entries

    def _device(self, position: int, row: tuple) -> DeviceView:
        _pk, _node, model_id, slug, vendor, memory_gb, health, isolated = row
        key = (position, slug, vendor, memory_gb, engine_health(isolated, health), model_id)
        device = self._interned.get(key)
        if device is None:
            device = self._interned[key] = DeviceView(
                index=position,
                model=slug,
                vendor=vendor,
                memory_mib=memory_gb * 1024,
                health=key[4],
                slice_profiles=self._profiles.get(model_id, {}),
            )
        return device

    def _read_allocations(self, pks: set[int] | None) -> dict[int, _AllocationEntry]:
        active = Allocation.objects.filter(state=AllocationState.ACTIVE)
        shares = AllocationDevice.objects.filter(allocation__state=AllocationState.ACTIVE)
        if pks is not None:
            active, shares = active.filter(pk__in=pks), shares.filter(allocation_id__in=pks)
        bound: dict[int, list[tuple[int, int]]] = {}
        for allocation_id, device_id, milli in shares.values_list("allocation_id", "device_id", "milli"):
            bound.setdefault(allocation_id, []).append((device_id, milli))
        rows = active.annotate(ends_at=ENDS_AT).values_list(
            "pk", "request_id", "node_id", "cpu_milli", "memory_mib", "priority", "preemptible", "started_at", "ends_at"
        )
        return {
            pk: _AllocationEntry(pk, request_id, node_id, tuple(sorted(bound.get(pk, ()))), *rest)
            for pk, request_id, node_id, *rest in rows
        }

    # -- the engine's view ---------------------------------------------------------------------------------------

    def view(self):
        """(engine snapshot, device ids, node ids, expiries), built once per change of the state."""
        if self._view is None:
            ordered = sorted(self.nodes.items(), key=lambda item: item[1].node.name)
            device_ids, node_ids, positions, names = {}, {}, {}, {}
            for node_pk, entry in ordered:
                name = entry.node.name
                node_ids[name], names[node_pk] = node_pk, name
                for position, device_pk in enumerate(entry.device_pks):
                    device_ids[(name, position)] = device_pk
                    positions[device_pk] = position
            # Newest first, as the allocations' default ordering reads them.
            running = sorted(self.allocations.values(), key=lambda a: (a.started_at, a.pk), reverse=True)
            allocations = [
                RunningAllocation(
                    str(a.request_id),
                    names[a.node_pk],
                    tuple(sorted((positions[device_pk], milli) for device_pk, milli in a.shares)),
                    a.cpu_milli,
                    a.memory_mib,
                    a.priority,
                    a.preemptible,
                    a.started_at.timestamp(),
                )
                for a in running
            ]
            expires = {str(a.request_id): a.ends_at for a in running}
            snapshot = Snapshot([entry.node for _pk, entry in ordered], allocations)
            self._view = (snapshot, device_ids, node_ids, expires)
        return self._view

    def checksum(self) -> tuple[int, int, int, int]:
        """What CHECKSUM_SQL counts, as this state has it."""
        return (
            len(self.allocations),
            sum(self.allocations),
            len(self.nodes),
            sum(len(entry.device_pks) for entry in self.nodes.values()),
        )


class KeptState:
    """The process's ClusterState and its place in the change log."""

    def __init__(self):
        self.cluster: ClusterState | None = None
        self.cursor = "0"  # xid8 horizon of the last read, as text
        self.last_id = 0  # the newest log id seen
        self.read_at: datetime | None = None
        self.catch_ups = 0
        self.confirmed = False  # the transaction of the last read committed
        self.rebuilds = 0  # full reads after the first, for tests and the benchmark's report

    def current(self) -> ClusterState:
        """The cluster as the database has it now: the kept state plus the changes since, or a full read."""
        if connection.vendor != "postgresql":
            return self._rebuild()
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT pg_snapshot_xmin(pg_current_snapshot())::text, now(), "
                f"(SELECT coalesce(max(id), 0) FROM {LOG}), {CHECKSUM_SQL}",
                [AllocationState.ACTIVE, AllocationState.ACTIVE],
            )
            horizon, now, last_id, *checksum = cursor.fetchone()
            usable, changes = self._usable(now, last_id), []
            if usable:
                cursor.execute(f"SELECT DISTINCT kind, object_id FROM {LOG} WHERE xid >= %s::xid8", [self.cursor])
                changes = cursor.fetchall()
        self._confirm_on_commit()
        self.catch_ups += 1
        due = self.catch_ups % settings.SCHEDULER_STATE_REBUILD_CYCLES == 0
        # Rows are read again from every transaction possibly unfinished at the last read (on a shared server that
        # horizon can lag): an `all` row costs one look at the slice tables, not a rebuild, unless they changed.
        if not usable or (any(kind == "all" for kind, _ in changes) and self.cluster.catalog_changed()):
            return self._rebuild(horizon, now, last_id)
        self.cluster.reread(
            node_pks={pk for kind, pk in changes if kind == "node"},
            allocation_pks={pk for kind, pk in changes if kind == "allocation"},
        )
        self.cursor, self.last_id, self.read_at = horizon, last_id, now
        if self.cluster.checksum() != tuple(checksum):
            logger.warning("cluster_state_drift: checksum %s, kept %s", checksum, self.cluster.checksum())
            return self._rebuild(horizon, now, last_id)
        if due:
            return self._compare_with_fresh(horizon, now, last_id)
        return self.cluster

    def _usable(self, now, last_id) -> bool:
        return (
            self.cluster is not None
            and self.confirmed
            and last_id >= self.last_id
            and self.read_at is not None
            and now - self.read_at < KEEP_LOG / 2
        )

    def _confirm_on_commit(self) -> None:
        self.confirmed = False

        def confirm():
            # Inside an enclosing transaction (a test's) nothing is committed yet: stay unconfirmed.
            self.confirmed = not connection.in_atomic_block

        transaction.on_commit(confirm)

    def _rebuild(self, horizon="0", now=None, last_id=0) -> ClusterState:
        if self.cluster is not None:
            self.rebuilds += 1
        state = ClusterState()
        state.read_all()
        self.cluster, self.cursor, self.last_id, self.read_at = state, horizon, last_id, now
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"DELETE FROM {LOG} WHERE at < now() - %s", [KEEP_LOG])
        return state

    def _compare_with_fresh(self, horizon, now, last_id) -> ClusterState:
        kept = self.cluster.view()
        fresh = self._rebuild(horizon, now, last_id)
        if fresh.view() != kept:
            logger.warning("cluster_state_drift: the periodic full read differs from the kept state")
        return fresh


kept = KeptState()  # one per process: the scheduler's cycles run in it one at a time (the cycle lock)
