"""Steady state at a bounded size for `make bench`: `python -m bench scheduler --scale 1 --requests 2000 --steady 5
--arrivals 200 --warmup 1` on its own scratch database (the 10x runs are the documented flags in
docs/benchmarks/history.md)."""

from bench.headline import Headline
from bench.report.scale import bench_scheduler_on_fresh_database

TITLE = "Scheduler steady state (bounded)"
DESCRIPTION = (
    "`python -m bench scheduler --scale 1 --requests 2000 --steady 5 --arrivals 200 --warmup 1`: 2,000 trace "
    "requests queued at t = 0 on the openb fleet, then every simulated minute the requests whose trace duration "
    "ended are released, Poisson(200) arrive and one cycle runs (simulated clock; preemption and the head-of-line "
    "reservation on). Cycle wall and CPU time p50/p99/max after the first (filling) minute, queries per cycle, "
    "engines built and policies learnt again on the kept engine (the other cycles advance it), the simulated "
    "queued -> allocated wait and the oldest wait still queued. Mix and method: bench/fleet.py, "
    "bench/steady.py."
)
TARGET = "tracked at this size (the 10x steady state: p99 cycle <= 10 s)"


def headline(rows: list[dict]) -> Headline:
    (steady,) = rows
    return Headline(
        f"cycle p99 {steady['cycle_p99_s']} s, queries {steady['queries_min']}-{steady['queries_max']}, "
        f"wait p99 {steady['wait_p99_s']} s"
    )


def run() -> list[dict]:
    load, report, load_after = bench_scheduler_on_fresh_database(
        "--scale", "1", "--requests", "2000", "--steady", "5", "--arrivals", "200", "--warmup", "1"
    )
    keys = [
        "nodes",
        "cycles",
        "warmup_cycles",
        "cycle_p50_s",
        "cycle_p99_s",
        "cycle_max_s",
        "cycle_cpu_p50_s",
        "cycle_cpu_p99_s",
        "engine_builds",
        "engine_relearns",
        "queries_min",
        "queries_max",
        "allocated",
        "preempted",
        "departed",
        "wait_p50_s",
        "wait_p99_s",
        "wait_max_s",
        "still_queued",
        "oldest_queued_wait_s",
    ]
    return [{**{key: report[key] for key in keys}, "load": f"{load} - {load_after}"}]
