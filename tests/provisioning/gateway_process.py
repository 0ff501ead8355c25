"""Real gateway processes (`manage.py run_gateway`) on the test database and a dedicated Redis database, for the
tests that call /serve/... through the data plane. The tests that use them are transactional: the gateway reads what
the test committed, as it reads the control plane's writes in production."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.db import connection

from config.env import database_url
from config.probes import NotAnswering, wait_until_answers
from tests.provisioning.redfish_emulator import free_loopback_port

REPO = Path(__file__).resolve().parents[2]


def worker_redis_url(first_worker: int, second_worker: int) -> str:
    """A Redis database of this pytest-xdist worker's own. `--dist loadgroup` keeps the tests that share one in a
    single worker (tests/conftest.py), but a run without it (`pytest -n 2` alone, or under pytest 9, which hid the
    groups from xdist until pyproject.toml pinned it below) spreads them, and one worker then flushed or read the
    other's counters."""
    return f"redis://127.0.0.1:6379/{second_worker if os.environ.get('PYTEST_XDIST_WORKER') == 'gw1' else first_worker}"


REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", worker_redis_url(12, 15))


@dataclass
class GatewayProcess:
    process: subprocess.Popen
    url: str
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """The exit code; a gateway that outlasts `timeout` is killed and fails the test with its log (a stop that
        hangs prints its threads' stacks there) and what its database sessions were waiting on."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            sessions = database_sessions()
            self.process.send_signal(signal.SIGUSR1)  # its stacks, to its log
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=1)
            self.process.kill()
            self.process.wait()
            pytest.fail(f"The gateway did not stop within {timeout} s of signal {sig}.\n{sessions}\n{self.tail()}")

    def waits_on_a_lock(self) -> bool:
        """Whether one of its database sessions waits for a lock another session holds."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                [f"gateway-{urlsplit(self.url).port}"],
            )
            return cursor.fetchone() is not None

    def tail(self) -> str:
        return self.log.read_text()[-6000:] if self.log.exists() else ""


def database_sessions() -> str:
    """The other sessions on the test database: what each runs or waits on, and which sessions block it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, wait_event_type, wait_event, pg_blocking_pids(pid), "
            "now() - xact_start, left(query, 200) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return "\n".join(" | ".join(map(str, row)) for row in cursor.fetchall())


def start_gateway(log: Path, *, redis_url: str = REDIS_URL, **extra_env: str) -> GatewayProcess:
    port = free_loopback_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": redis_url,
        "PGAPPNAME": f"gateway-{port}",  # its sessions, named in database_sessions()
        "GATEWAY_SHUTDOWN_SECONDS": "2",  # a stop that outlasts 8 s prints its stacks (see Gateway._shutdown)
        **extra_env,
    }
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_gateway", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    gateway = GatewayProcess(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_until_answers(f"{gateway.url}/healthz", seconds=60, process=process, interval=0.1)
    except NotAnswering as down:
        gateway.stop(signal.SIGKILL)
        pytest.fail(f"The gateway did not come up ({down}):\n{gateway.tail()}")
    return gateway


@pytest.fixture
def gateway_redis(settings):
    """The control plane (this test process) and the gateways share a Redis database of their own."""
    store = redis.from_url(REDIS_URL)
    store.flushdb()
    settings.REDIS_URL = REDIS_URL
    yield store
    store.flushdb()
    store.close()


@pytest.fixture
def gateways(gateway_redis, tmp_path):
    """A factory of gateway processes; each one still running is stopped at the end (one that does not stop fails
    the test)."""
    started: list[GatewayProcess] = []

    def start(**extra_env) -> GatewayProcess:
        gateway = start_gateway(tmp_path / f"gateway-{len(started)}.log", **extra_env)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        if gateway.process.poll() is None:
            gateway.stop(timeout=15)


def until(condition, *, seconds: float, what: str):
    """Poll `condition` until it is truthy; how long that took."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if value := condition():
            return time.monotonic() - started, value
        time.sleep(0.02)
    pytest.fail(f"Timed out after {seconds} s waiting for {what}")
