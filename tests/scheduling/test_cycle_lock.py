"""One cycle at a time across processes, and no trigger lost to a running cycle.

Real `manage.py run_cycle` processes on the test database, each with its own connection (within one connection the
advisory lock is re-entrant, so only separate sessions can show it working). A cycle is held mid-way
deterministically: another connection holds every device row, so a cycle that has taken the lock and placed a
request waits at its device write; the test waits for that in pg_stat_activity, never on a clock.
"""

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from django.db import connection
from django_q.conf import Conf

from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling import cycle
from scheduling.models import Device
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

REPO = Path(__file__).resolve().parents[2]
SECONDS = 60  # bound on every wait: a broken lock or a lost wake-up fails the test, it does not hang it


def _database_url() -> str:
    database = connection.settings_dict
    return f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"


@pytest.fixture
def cycle_process():
    """Starts `manage.py run_cycle --json` in its own process (follow-up work such as provisioning goes to the
    broker); whatever is still running when the test ends is killed."""
    started = []

    def start() -> subprocess.Popen:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings_test",
            "DATABASE_URL": _database_url(),
            "Q_SYNC": "0",
        }
        started.append(
            subprocess.Popen(
                [sys.executable, "manage.py", "run_cycle", "--json"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=SECONDS)


def outcome(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=SECONDS)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@contextmanager
def rows_held(model, **where):
    """Another session holds the model's rows (those matching `where`) until the block ends."""
    ids = list(model.objects.filter(**where).values_list("pk", flat=True))
    with psycopg.connect(_database_url()) as blocker:
        blocker.execute(f"SELECT id FROM {model._meta.db_table} WHERE id = ANY(%s) FOR UPDATE", [ids]).fetchall()
        yield
        blocker.rollback()


def wait_until_it_waits_for_a_row(process: subprocess.Popen, statement: str) -> None:
    """Until `process` waits for a row lock in a statement that contains `statement` (within the first 1024
    characters: pg_stat_activity keeps no more of it)."""
    deadline = time.monotonic() + SECONDS
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE %s",
                [f"%{statement}%"],
            )
            if cursor.fetchone()[0]:
                return
            assert process.poll() is None, f"it ended without waiting: {process.communicate()}"
            time.sleep(0.05)  # polling interval; the condition itself is what the test waits for
    pytest.fail(f"it never waited at {statement}")


def wait_for_a_cycle_at_the_device_write(process: subprocess.Popen) -> None:
    wait_until_it_waits_for_a_row(process, f"UPDATE {Device._meta.db_table}")


@pytest.fixture
def world(shop, team):  # noqa: F811 (the fixtures imported above)
    """The shop and team of test_cycle, and one node with four cards."""
    add_node(shop.accelerator, cards=4)
    return SimpleNamespace(shop=shop, team=team)


@pytest.fixture(autouse=True)
def no_inline_tasks(monkeypatch):
    """Triggers go to the broker (nobody runs it here), so the only cycles are the ones the test starts."""
    monkeypatch.setattr(Conf, "SYNC", False)


def test_two_cycles_from_two_processes_exactly_one_runs(world, cycle_process):
    request = queued(world.shop, world.team)
    with rows_held(Device):
        first = cycle_process()
        wait_for_a_cycle_at_the_device_write(first)
        second = outcome(cycle_process())  # returns while the first one still holds the lock
        assert second == {"ran": False, "allocated": [], "waiting": {}}
    assert outcome(first)["allocated"] == [request.pk]
    assert ResourceRequest.objects.get(pk=request.pk).state == RequestState.ALLOCATED


def test_a_trigger_that_meets_a_running_cycle_gets_one_more_cycle_after_it(world, cycle_process):
    """The running cycle read the queue before the second request was queued; the trigger for that request finds
    the lock taken. The running cycle must place it itself once it has committed, not leave it to the schedule."""
    early = queued(world.shop, world.team)
    with rows_held(Device):
        running = cycle_process()
        wait_for_a_cycle_at_the_device_write(running)
        late = queued(world.shop, world.team)
        assert cycle.run_cycle().ran is False  # the trigger's cycle, as the task would run it
    assert sorted(outcome(running)["allocated"]) == [early.pk, late.pk]
    assert set(ResourceRequest.objects.filter(pk__in=[early.pk, late.pk]).values_list("state", flat=True)) == {
        RequestState.ALLOCATED
    }


def test_a_queued_request_another_transaction_holds_is_waited_for_not_skipped(world, cycle_process):
    """Skipped, it would wait for a trigger that its holder (here one that commits no change) never sends."""
    request = queued(world.shop, world.team)
    with rows_held(ResourceRequest, pk=request.pk):
        running = cycle_process()
        wait_until_it_waits_for_a_row(running, f'SELECT "{ResourceRequest._meta.db_table}"."id"')
    assert outcome(running)["allocated"] == [request.pk]
