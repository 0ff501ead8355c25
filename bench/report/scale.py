"""The scheduler at K times the openb cluster: the engine's decisions/s at 1x and 10x the fleet (the FGD protocol's
arrival sequence, `python -m bench.placement --scale K`), and cycles through PostgreSQL on a trace workload
(`python -m bench scheduler --scale K`), each in its own process and the cycles on their own scratch database.
Sizes here are bounded for `make bench`; the large points (100,000 queued, 12,130 nodes) are the documented flags
in docs/benchmarks/history.md. Needs ../shared/data/openb (the public trace, never copied into the project)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from bench.headline import Headline
from bench.report import placement_report

ROOT = Path(__file__).resolve().parents[2]
# Beside the checkout (/work/main -> /work/shared), or beside a worktree's parent (/work/wt/<name> -> /work/shared).
OPENB = next(
    (
        path
        for path in (ROOT.parent / "shared" / "data" / "openb", ROOT.parents[1] / "shared" / "data" / "openb")
        if path.is_dir()
    ),
    ROOT.parent / "shared" / "data" / "openb",
)
SERVER_URL = os.environ.get("BENCH_DATABASE_SERVER", "postgres://postgres@127.0.0.1:5432")
DATABASE = "compute_catalog_bench_scale"
TITLE = "Scheduler at scale (openb fleet K times, trace workload)"
CYCLES = [(1, 2000), (2, 2000)]  # (K, queued): bounded for make bench; --scale 10 --requests 100000 by hand
ENGINE_SCALES = [1, 10]
DESCRIPTION = (
    "Engine rows: `python -m bench.placement openb --pods openb_pod_list_default.csv --policy fgd-plus --seeds 42 "
    "--scale K` (one core, pending reasons included). Cycle rows: `python -m bench scheduler --scale K --requests N "
    "--cycles 2` on a fresh database: the openb node list K times (sites, topology domains), N queued requests "
    "drawn from the gpuspec33 trace's GPU pods (priority classes from QoS, 200 projects with concurrent-task and "
    "card-hour quotas; mix in bench/fleet.py), then two cycles (the second over what the first left), wall "
    "time including every database write and queries per cycle. Large points: docs/benchmarks/history.md."
)
TARGET = "one cycle over 100,000 queued on 12,130 nodes <= 30 s; >= 5,000 decisions/s at 12k; queries constant"


def _engine(scale: int) -> dict:
    summary = placement_report(
        "openb",
        "--nodes",
        str(OPENB / "openb_node_list_gpu_node.csv"),
        "--pods",
        str(OPENB / "openb_pod_list_default.csv"),
        "--policy",
        "fgd-plus",
        "--seeds",
        "42",
        "--scale",
        str(scale),
    )
    return {
        "what": "engine",
        "nodes": summary["nodes"],
        "queued": "-",
        "cycle": "-",
        "allocated": "-",
        "seconds": "-",
        "queries": "-",
        "decisions/s": summary["decisions_per_s"],
        "decisions/CPU s": summary["decisions_per_cpu_s"],
        "load": _load(),
    }


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def bench_scheduler_on_fresh_database(*arguments: str) -> tuple[str, dict | list, str]:
    """`python -m bench scheduler --nodes <openb> <arguments> --json --force` on a freshly migrated scratch database:
    the load average before, its JSON report, the load average after."""
    nodes = str(OPENB / "openb_node_list_gpu_node.csv")
    return bench_on_fresh_database("scheduler", "--nodes", nodes, *arguments, "--json")


def bench_on_fresh_database(*arguments: str) -> tuple[str, dict | list, str]:
    """`python -m bench <arguments> --force` on a freshly migrated scratch database: the load average before, the
    JSON its last line prints, the load average after."""
    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
    env = {**os.environ, "DATABASE_URL": f"{SERVER_URL}/{DATABASE}"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    load = _load()
    command = [sys.executable, "-m", "bench", *arguments, "--force"]
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return load, json.loads(out.strip().splitlines()[-1]), _load()


def _cycles(scale: int, queued: int) -> list[dict]:
    load, rows, load_after = bench_scheduler_on_fresh_database(
        "--scale", str(scale), "--requests", str(queued), "--cycles", "2"
    )
    return [
        {
            "what": "cycle",
            "nodes": row["nodes"],
            "queued": row["queued"],
            "cycle": row["cycle"],
            "allocated": row["allocated"],
            "seconds": row["cycle_seconds"],
            "queries": row["queries_per_cycle"],
            "decisions/s": "-",
            "decisions/CPU s": "-",
            "load": f"{load} - {load_after}",
        }
        for row in rows
    ]


def headline(rows: list[dict]) -> Headline:
    cycles = [row for row in rows if row["what"] == "cycle"]
    largest = max(cycles, key=lambda row: (row["nodes"], row["queued"]))
    engine = max((row for row in rows if row["what"] == "engine"), key=lambda row: row["nodes"])
    return Headline(
        f"cycle over {largest['queued']:,} queued on {largest['nodes']:,} nodes {largest['seconds']} s, "
        f"{largest['queries']} queries; engine {engine['decisions/s']} decisions/s at {engine['nodes']:,} nodes"
    )


def run() -> list[dict]:
    rows = [_engine(scale) for scale in ENGINE_SCALES]
    for scale, queued in CYCLES:
        rows += _cycles(scale, queued)
    return rows
