"""The cluster state a scheduler process keeps between cycles: after any mix of changes it equals a fresh read.

Transactional tests (real commits): the kept state trusts only what committed, so inside a test's enclosing
transaction it would read everything again each time and prove nothing about the deltas."""

import pytest
from django.db import connection, transaction
from django.utils import timezone

from requests.models import ResourceRequest
from requests.services import request_release
from scheduling import cluster_state, cycle, reclaim
from scheduling.choices import AllocationState, DeviceHealth
from scheduling.models import Allocation, Device, Node
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def kept(monkeypatch):
    """A fresh kept state for the cycles of this test (the process-wide one may hold another test's cluster)."""
    fresh = cluster_state.KeptState()
    monkeypatch.setattr(cluster_state, "kept", fresh)
    return fresh


def kept_equals_fresh(kept: cluster_state.KeptState) -> None:
    with transaction.atomic():
        state = kept.current()
    fresh = cycle.load_snapshot()
    snapshot, device_ids, node_ids, expires = state.view()
    assert list(snapshot.nodes) == list(fresh.snapshot.nodes)
    assert sorted(snapshot.allocations, key=lambda a: a.id) == sorted(fresh.snapshot.allocations, key=lambda a: a.id)
    assert (device_ids, node_ids, expires) == (fresh.device_ids, fresh.node_ids, fresh.expires)


def release(request_id: int) -> None:
    request_release(request=ResourceRequest.objects.get(pk=request_id), actor=None, reason="test")
    reclaim.allocation_free(request_ids=[request_id], reason="test")


def test_mixed_changes_are_applied_as_deltas_and_match_a_fresh_read(shop, team, kept):  # noqa: F811
    add_node(shop.accelerator, "n1")
    add_node(shop.accelerator, "n2")
    # Each submission runs a cycle after its commit (django-q2 in sync mode): the first builds the kept state, the
    # others catch up on the allocations the one before committed.
    first, second, third = (queued(shop, team) for _ in range(3))
    assert Allocation.objects.filter(state=AllocationState.ACTIVE).count() == 3 and kept.rebuilds == 0
    kept_equals_fresh(kept)  # the cycle's own allocations arrive as deltas

    release(second.pk)  # allocation freed
    Device.objects.filter(node__name="n1", index=0).update(health=DeviceHealth.DEGRADED)  # health, in bulk
    Device.objects.filter(node__name="n1", index=1).update(isolated=True, isolation_reason="test")
    Node.objects.filter(name="n2").update(schedulable=False, cordon_reason="test", cordoned_at=timezone.now())
    add_node(shop.accelerator, "n3", cards=2)  # inventory grows
    Device.objects.filter(node__name="n3", index=1).delete()  # and shrinks
    Node.objects.filter(name="n3").update(cpu_milli=32_000)
    ResourceRequest.objects.filter(pk=first.pk).update(duration_hours=999)  # an extension moves the expiry
    queued(shop, team)  # and a cycle in between, on the deltas
    assert Allocation.objects.filter(state=AllocationState.ACTIVE).count() == 3
    kept_equals_fresh(kept)
    assert kept.rebuilds == 0, "every change came as a delta"
    assert third.pk in {int(a.id) for a in kept.cluster.view()[0].allocations}


def test_a_missed_delta_forces_a_full_read(shop, team, kept):  # noqa: F811
    add_node(shop.accelerator, "n1")
    request = queued(shop, team)  # placed by the cycle after its submission
    kept_equals_fresh(kept)
    with connection.cursor() as cursor:  # an allocation freed behind the log's back
        cursor.execute("ALTER TABLE scheduling_allocation DISABLE TRIGGER USER")
        try:
            Allocation.objects.filter(request=request).update(
                state=AllocationState.RELEASED, released_at=timezone.now()
            )
        finally:
            cursor.execute("ALTER TABLE scheduling_allocation ENABLE TRIGGER USER")
        # Old rows are read again while the horizon lags (and would show the release): only a newer one is left.
        cursor.execute(f"DELETE FROM {cluster_state.LOG}")
        cursor.execute(f"INSERT INTO {cluster_state.LOG} (kind, object_id) VALUES ('node', 0)")
    kept_equals_fresh(kept)  # the checksum of running allocations disagreed
    assert kept.rebuilds == 1
    Node.objects.filter(name="n1").update(schedulable=False, cordon_reason="test", cordoned_at=timezone.now())
    with connection.cursor() as cursor:  # and the log lost the row that says so (pruned, truncated)
        cursor.execute(f"DELETE FROM {cluster_state.LOG}")
    kept_equals_fresh(kept)  # its newest id went backwards
    assert kept.rebuilds == 2


def test_a_rolled_back_cycle_leaves_no_trace_in_the_kept_state(shop, team, kept):  # noqa: F811
    with transaction.atomic():  # submitted with no node to run on: stays queued
        queued(shop, team)
    add_node(shop.accelerator, "n1")
    with pytest.raises(RuntimeError), transaction.atomic():
        cycle.run_cycle()  # reads and places inside this transaction, which then rolls back
        raise RuntimeError
    assert not Allocation.objects.exists()
    kept_equals_fresh(kept)
    assert kept.rebuilds == 1, "the state read inside the rolled-back transaction was not trusted"


def test_periodic_full_read_compares_and_keeps_the_fresh_state(shop, team, kept, settings):  # noqa: F811
    settings.SCHEDULER_STATE_REBUILD_CYCLES = 2
    add_node(shop.accelerator, "n1")
    kept_equals_fresh(kept)
    kept_equals_fresh(kept)  # the second catch-up reads everything again
    assert kept.rebuilds == 1
