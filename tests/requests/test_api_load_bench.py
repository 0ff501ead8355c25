"""The API load benchmark (bench/report/api_load.py) at a tiny size, real gunicorn and Redis included, so that
it cannot rot: seeded by COPY, served, driven by the simulated users, measured and sized."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from bench import api_load_client

pytestmark = pytest.mark.integration  # starts processes of its own

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_load_benchmark_runs_at_a_tiny_size():
    env = {
        **os.environ,
        "BENCH_API_DATABASE": f"{connection.settings_dict['NAME']}_api_load",
        "BENCH_API_REDIS_URL": "redis://127.0.0.1:6379/14",
    }
    tiny = ["--requests", "300", "--events", "3000", "--projects", "10", "--users", "6"]
    tiny += ["--warmup", "1", "--duration", "3", "--submit-duration", "2", "--think-ms", "50"]
    tiny += ["--workers", "2", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.report.api_load", *tiny],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])

    assert (report["seeded_requests"], report["seeded_events"]) == (300, 3000)
    endpoints = report["mix"]["endpoints"]
    assert {"list", "queue", "inbox"} <= set(endpoints)
    for numbers in [*endpoints.values(), *report["submit"]["endpoints"].values()]:
        assert numbers["count"] > 0 and set(numbers["statuses"]) <= {"200", "201"}, numbers
    assert report["submit"]["endpoints"]["submit (closed loop)"]["statuses"]["201"] > 0
    for phase in ("mix", "submit"):
        assert report[phase]["gunicorn_cpu_ms_per_request"] > 0 and report[phase]["postgres_cpu_ms_per_request"] > 0
    assert report["requests_after"] > report["requests_before"] == 300
    rows = {table["table"]: table["rows"] for table in report["tables"]}
    assert rows["scheduling_allocation"] > 0 and rows["scheduling_allocationdevice"] >= rows["scheduling_allocation"]
    assert set(report["queries"]) >= {"list", "detail", "queue", "inbox"}
    tables = {table["table"]: table for table in report["tables"]}
    assert tables["requests_requestevent"]["rows"] >= 3000
    assert tables["requests_resourcerequest"]["index_bytes"] > 0


def test_simulated_users_start_spread_out_and_stop_thinking_at_the_deadline(monkeypatch):
    """Each user thinks before its first call as between calls (50 users calling at a phase's first instant made its
    slowest second), and no think time outlasts the phase (it stretched the time a phase's rates are counted over)."""
    calls = []

    async def act(http, plan, user, rng, record):
        calls.append(time.monotonic())
        record.sent += 1

    monkeypatch.setitem(api_load_client.ROLES, "developer", act)
    plan = {"seed": 1, "think_ms": 300, "users": [{"role": "developer"}] * 40}
    record = api_load_client.Recorder(limit=10_000, seconds=1.0)
    started = time.monotonic()
    asyncio.run(api_load_client._mix(None, plan, record))

    assert time.monotonic() - started < 1.2  # thinking (mean 0.3 s, some far longer) ends with the phase
    first_calls = sorted(calls)[: len(plan["users"])]
    assert first_calls[-1] - first_calls[0] > 0.1  # not all at once
    assert 60 < len(calls) < 250  # ~40 users x 1 s / 0.3 s
