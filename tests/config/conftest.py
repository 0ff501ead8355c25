"""The app served for real: gunicorn on a free loopback port, on this test run's PostgreSQL database."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from config.probes import NotAnswering, wait_until_answers

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _app_env() -> dict:
    """The test settings on this run's database, with production error handling (DEBUG off)."""
    database = connection.settings_dict
    host, port = database["HOST"] or "127.0.0.1", database["PORT"] or 5432
    url = f"postgres://{database['USER']}@{host}:{port}/{database['NAME']}"
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "DATABASE_URL": url,
        "DEBUG": "0",
        "LOG_LEVEL": "WARNING",
    }


def _wait_until_up(url: str, server: subprocess.Popen, log: Path, seconds: float = 60.0) -> None:
    try:
        wait_until_answers(url, seconds=seconds, process=server)
    except NotAnswering as down:
        pytest.fail(f"{down}:\n{log.read_text()[-3000:]}")


@pytest.fixture
def served_app(tmp_path):
    """gunicorn with 2 workers of 4 threads (keep-alive, as in production): (base URL, its log file). Tests using
    it are transactional (the server sees only committed rows) with serialized rollback (the migrations' data)."""
    port, log = _free_port(), tmp_path / "gunicorn.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "2",
            "--threads",
            "4",
            "--timeout",
            "60",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=_app_env(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_up(f"http://127.0.0.1:{port}/healthz", server, log)
        yield f"http://127.0.0.1:{port}", log
    finally:
        server.terminate()
        server.wait(timeout=30)
