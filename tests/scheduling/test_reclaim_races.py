"""Reclaim batches are atomic per item, under real concurrency on PostgreSQL (two connections).

A user's release holds a request's row while the expiry, staleness and runtime batches run: the batch never waits
for it, releases every other item, reports the held one `busy` and changes nothing for it; the next pass sees the
user's release as `already_releasing`. Synchronisation waits on events and on pg_stat_activity, never on sleeps.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from requests import services
from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling import cycle, reclaim
from scheduling.models import Allocation
from tests.requests.test_concurrency import _migrated_data, in_own_connection  # noqa: F401  (fixture)
from tests.scheduling.inventory_helpers import end_terms_at
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)
TIMEOUT = 10.0

BATCHES = {
    "expired": lambda ids: reclaim.reclaim_expired(),
    "stale": lambda ids: reclaim.reclaim_stale(),
    "runtime_gone": lambda ids: reclaim.runtime_report(reports=[(pk, "gone") for pk in ids]).results,
}


def lock_waiters() -> int:
    """Backends of this test database waiting for a row or table lock right now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # activity is otherwise frozen per transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


def wait_until(condition, what: str):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)  # polling interval of the condition, not a synchronisation margin


@pytest.fixture
def three_due(shop, team):  # noqa: F811
    """Three running requests whose allocations are expired and stale at once."""
    add_node(shop.accelerator, cards=6)
    requests = [queued(shop, team) for _ in range(3)]
    cycle.run_cycle()
    long_ago = timezone.now() - timedelta(days=2)
    end_terms_at(long_ago)
    Allocation.objects.update(heartbeat_at=long_ago)
    return [ResourceRequest.objects.get(pk=request.pk) for request in requests]


def while_held(hold, batch):
    """Run `hold` (which takes row locks) in one connection and keep its transaction open while `batch` runs in
    another; the batch must finish without ever waiting for those locks. Returns what the batch returned."""
    locked, finish = threading.Event(), threading.Event()

    @in_own_connection
    def holder():
        with transaction.atomic():
            hold()
            locked.set()
            assert finish.wait(TIMEOUT)

    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(holder)
        try:
            assert locked.wait(TIMEOUT)
            run = pool.submit(in_own_connection(batch))
            wait_until(lambda: run.done() or lock_waiters(), "the batch finished or waited for the held rows")
            assert run.done(), "the batch waited for rows another transaction holds"
            return run.result()
        finally:
            finish.set()
            held.result(timeout=TIMEOUT)


@pytest.mark.parametrize("batch", BATCHES)
def test_a_batch_releases_the_others_and_reports_the_one_a_user_is_releasing(batch, team, three_due):  # noqa: F811
    first, held, last = three_due
    outcomes = while_held(
        lambda: services.request_release(request=held, actor=team.developer, reason="done early"),
        lambda: BATCHES[batch]([request.pk for request in three_due]),
    )
    assert outcomes == {first.pk: "released", held.pk: "busy", last.pk: "released"}
    states = dict(ResourceRequest.objects.filter(pk__in=[first.pk, last.pk, held.pk]).values_list("pk", "state"))
    assert states == dict.fromkeys([first.pk, last.pk, held.pk], RequestState.RELEASED)
    held_events = list(
        ResourceRequest.objects.get(pk=held.pk).events.filter(code="releasing").values_list("message", flat=True)
    )
    assert held_events == ["Release started by " + team.developer.username + ": done early"]  # the user's only


def test_expiry_warnings_skip_a_held_allocation_and_warn_it_once_on_the_next_pass(three_due):
    end_terms_at(timezone.now() + timedelta(hours=1))
    # Running (provisioning is not what this test is about): only running requests are warned.
    ResourceRequest.objects.filter(pk__in=[request.pk for request in three_due]).update(state=RequestState.ACTIVE)
    held = Allocation.objects.get(request=three_due[1])
    assert while_held(lambda: Allocation.objects.select_for_update().get(pk=held.pk), reclaim.warn_expiring) == 2
    assert not ResourceRequest.objects.get(pk=held.request_id).events.filter(code="expiry_warning").exists()
    assert (reclaim.warn_expiring(), reclaim.warn_expiring()) == (1, 0)
    for request in three_due:
        assert request.events.filter(code="expiry_warning").count() == 1
