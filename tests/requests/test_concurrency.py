"""Admission under real concurrency on PostgreSQL: the quota lock lets exactly the requests that fit in."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from requests import services
from requests.choices import EventCode, OverQuota, RequestState
from requests.models import ResourceRequest
from requests.quota import lock_quota_scope, usage_of
from requests.services import QuotaExceeded
from tenancy.models import Project, ProjectQuota
from tests.migrated_rows import migrated_rows_reload
from tests.requests.conftest import make_order

S = RequestState
THREADS = 12
FITS = 3  # the whole-card spec takes 2 GPUs; the project may use 6
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture(scope="module", autouse=True)
def _migrated_data(django_db_setup, django_db_blocker):
    """Start from, and leave behind, the migrated data (standard vendors, groups), in any test order.

    A transactional test without serialized rollback leaves post_migrate's rows under new ids, which the
    snapshot reload of serialized rollback would collide with; one with it leaves empty tables behind.
    """
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, inhibit_post_migrate=True, verbosity=0)
    yield
    with django_db_blocker.unblock():
        migrated_rows_reload()


def in_own_connection(work):
    """Run `work` in a worker thread with its own database connection, closed at the end."""

    def run(*args, **kwargs):
        try:
            return work(*args, **kwargs)
        finally:
            connection.close()

    return run


def race(shop, team, over_quota) -> list:
    ProjectQuota.objects.filter(project=team.project).update(gpus=Decimal(2 * FITS))
    barrier = threading.Barrier(THREADS)

    @in_own_connection
    def submit(_):
        order = make_order(shop, Project.objects.get(pk=team.project.pk))
        barrier.wait(timeout=10)
        try:
            return services.request_submit(order=order, requester=team.developer, over_quota=over_quota).state
        except QuotaExceeded as refusal:
            return refusal.code

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(submit, range(THREADS)))


def test_simultaneous_submissions_admit_exactly_what_fits(shop, team):
    outcomes = race(shop, team, OverQuota.REJECT)
    assert sorted(outcomes) == sorted([S.QUEUED] * FITS + ["quota_exceeded"] * (THREADS - FITS))
    assert ResourceRequest.objects.count() == FITS
    assert usage_of([team.project.pk])["gpus"] == 2 * FITS


def test_simultaneous_submissions_that_may_wait_admit_exactly_what_fits(shop, team):
    outcomes = race(shop, team, OverQuota.WAIT)
    assert sorted(outcomes) == sorted([S.QUEUED] * FITS + [S.WAITING_FOR_QUOTA] * (THREADS - FITS))
    assert ResourceRequest.objects.filter(state=S.WAITING_FOR_QUOTA).count() == THREADS - FITS
    assert usage_of([team.project.pk])["gpus"] == 2 * FITS


def wait_until_someone_waits_for_a_lock(timeout=5.0):
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # activity is otherwise frozen per transaction
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the other readmission never waited for the quota lock")


def test_concurrent_readmissions_admit_a_waiting_request_once(shop, team):
    ProjectQuota.objects.filter(project=team.project).update(concurrent_tasks=1)
    services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    waiting = services.request_submit(
        order=make_order(shop, team.project), requester=team.developer, over_quota=OverQuota.WAIT
    )
    with ThreadPoolExecutor(1) as pool:
        with transaction.atomic():
            lock_quota_scope(team.project)
            other = pool.submit(in_own_connection(services.request_readmit_waiting), project_id=team.project.pk)
            wait_until_someone_waits_for_a_lock()
            ProjectQuota.objects.filter(project=team.project).update(concurrent_tasks=3)
            assert len(services.request_readmit_waiting(project_id=team.project.pk)) == 1
        assert other.result(timeout=10) == []
    stored = ResourceRequest.objects.get(pk=waiting.pk)
    assert stored.state == S.QUEUED
    assert stored.events.filter(code=EventCode.READMITTED).count() == 1


def test_simultaneous_submissions_with_one_idempotency_key_make_one_request(shop, team):
    barrier = threading.Barrier(THREADS)

    @in_own_connection
    def submit(_):
        order = make_order(shop, Project.objects.get(pk=team.project.pk))
        barrier.wait(timeout=10)
        return services.request_submit(order=order, requester=team.developer, idempotency_key="double-click").pk

    with ThreadPoolExecutor(THREADS) as pool:
        made = set(pool.map(submit, range(THREADS)))

    assert len(made) == 1 and ResourceRequest.objects.count() == 1
