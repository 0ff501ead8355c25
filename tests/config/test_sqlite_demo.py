"""The embedded demo (SQLite + the ORM broker) with a real qcluster: releases overlapping usage refreshes, written
from the workers and from another process at once, all finish and no background task fails."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts processes of its own

REPO = Path(__file__).resolve().parents[2]
DRIVER = "from tests.config.sqlite_demo_driver import main; main()"


def demo_env(database: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("REDIS_URL", "DATABASE_URL")}
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "1",
        "DATABASE_URL": f"sqlite:///{database}",
        "Q_WORKERS": "2",
    }


def manage(env: dict, *arguments: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"manage.py {arguments[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_releases_and_usage_refreshes_on_sqlite_all_finish_and_no_task_fails(tmp_path):
    env = demo_env(tmp_path / "demo.sqlite3")
    manage(env, "migrate", "--no-input")
    manage(env, "seed_demo")
    log = tmp_path / "qcluster.log"
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        output = manage(env, "shell", "-c", DRIVER)
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cluster.pid, signal.SIGKILL)

    result = json.loads(output.strip().splitlines()[-1])
    assert result["failures"] == [], log.read_text()[-3000:]
    assert result["states"] == ["released"] * 4
    assert "database is locked" not in log.read_text()
