"""Steady state at a bounded size for `make bench`: `manage.py bench_scheduler --scale 1 --requests 2000 --steady 5
--arrivals 200` on its own scratch database (the 10x runs are the documented flags in docs/BENCHMARKS.md)."""

import json
import os
import subprocess
import sys

import psycopg

from tests.bench.bench_scale import DATABASE, OPENB, ROOT, SERVER_URL, _load

TITLE = "Scheduler steady state (bounded)"
DESCRIPTION = (
    "`manage.py bench_scheduler --scale 1 --requests 2000 --steady 5 --arrivals 200`: 2,000 trace requests queued at "
    "t = 0 on the openb fleet, then every simulated minute the requests whose trace duration ended are released, "
    "Poisson(200) arrive and one cycle runs (simulated clock; preemption and the head-of-line reservation on). "
    "Cycle wall time p50/p99/max, queries per cycle, and the simulated queued -> allocated wait. Mix and method: "
    "scheduling/fleet.py, scheduling/steady.py."
)


def run() -> list[dict]:
    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
    env = {**os.environ, "DATABASE_URL": f"{SERVER_URL}/{DATABASE}"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    load = _load()
    out = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "bench_scheduler",
            "--nodes",
            str(OPENB / "openb_node_list_gpu_node.csv"),
            "--scale",
            "1",
            "--requests",
            "2000",
            "--steady",
            "5",
            "--arrivals",
            "200",
            "--json",
            "--force",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    keys = [
        "nodes",
        "cycles",
        "cycle_p50_s",
        "cycle_p99_s",
        "cycle_max_s",
        "queries_min",
        "queries_max",
        "allocated",
        "preempted",
        "departed",
        "wait_p50_s",
        "wait_p99_s",
        "wait_max_s",
        "still_queued",
    ]
    return [{**{key: report[key] for key in keys}, "load": f"{load} - {_load()}"}]
