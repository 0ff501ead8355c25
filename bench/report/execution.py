"""Execution backends end to end: approved one-GPU requests from queued to RUNNING/active on a real local runtime,
beside the backend alone in the same run (`python -m bench execution`, rounds interleaved)."""

import json
import os
import subprocess
import sys

from django.conf import settings

from bench.headline import Headline, row_where
from config.env import database_url

TITLE = "Execution backends: queued to active, beside the backend alone"
# (backend, requests): every backend of `python -m bench execution` that has a local runtime here.
RUNS = [("slurm", 100)]
WORKERS = 8
# slurmctld allocates a wave on its background loop's one-second tick after the submissions: where the tick falls
# moves a round's ratio by tenths, so the median is taken over eight rounds.
ROUNDS = 8
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
DESCRIPTION = (
    f"`python -m bench execution --backend <backend> --requests <n> --rounds {ROUNDS} --json`: the backend's real "
    "local runtime is started (slurm: devcluster/slurm_cluster.py, `slurmd -N` nodes with room for every request at "
    "once, slurmrestd with JWT, `SchedulerParameters=sched_min_interval=100000,batch_sched_delay=0`), its nodes "
    f"enter the inventory and a real `qcluster` ({WORKERS} workers, Redis broker) starts; one unmeasured wave of "
    "each warms the runtime and the workers. Each round measures, in an "
    "order that alternates, the platform (n approved one-GPU requests queued, one scheduling cycle; each request's "
    "time from the cycle's start to its `active` event, its job RUNNING on the node the platform chose: a start "
    "batch's worker submits its jobs, watches them until RUNNING and records their access and activation in the "
    "record of that watch; then all released) and Slurm alone (the same n batch jobs, as the driver builds them, "
    "submitted to the same slurmrestd "
    "by one client one after another, each timed from the first submission to RUNNING as a job list read every "
    "50 ms shows it; then cancelled). Each measurement begins once the broker holds no task and neither the "
    "workers nor Slurm's daemons use more than a trickle of CPU (a release's tasks and slurmctld's work after a "
    "hundred cancellations belong to the measurement before), and at the round's point of the wall clock's second, "
    "the same for both (slurmctld allocates a wave on its background loop's tick at whole seconds: its allocations "
    "are logged 0-50 ms past the second, so a round whose one side just missed a tick the other caught would differ "
    "by a second of luck; the rounds' points spread over the second). jobs_per_s = ready / the last one's time; "
    "ratio = platform / alone. `started`: when each side's first submission began and its last one was answered (the "
    "platform's from the cycle's start, Slurm alone's from its first submission); the rest of a side's time is Slurm "
    "starting the jobs and that side seeing them RUNNING. "
    "Targets (issue 32): ratio >= 0.85 with platform p50 <= 3 s. Platform, workers, PostgreSQL, Redis and the "
    "Slurm daemons share the machine's 2 cores with whatever else runs on it: `load` is the 1-minute load average "
    "before and after each round."
)
TARGET = "ratio >= 0.85 with platform p50 <= 3 s"


def rows_of(report: dict) -> list[dict]:
    """One row per round and the medians, with where a request's time went (median seconds) on the last."""
    rows = []
    for measured in report["per_round"]:
        platform, direct = measured["platform"], measured["direct"]
        rows.append(
            {
                "backend": report["backend"],
                "round": f"{measured['round']} ({measured['first']} first)",
                "requests": report["requests"],
                "jobs_per_s": platform["jobs_per_s"],
                "p50_s": platform["p50_s"],
                "wall_s": platform["wall_s"],
                "alone jobs_per_s": direct["jobs_per_s"],
                "alone p50_s": direct["p50_s"],
                "ratio": measured["ratio"],
                "started (s)": _started(platform["started_s"], direct["started_s"]),
                "load": " -> ".join(f"{value:.1f}" for value in measured["load_avg"]),
                "where the time goes (median s)": "",
            }
        )
    parts = {k: v for k, v in report["breakdown"].items() if isinstance(v, int | float)}
    rows.append(
        {
            "backend": report["backend"],
            "round": "median",
            "requests": report["requests"],
            "jobs_per_s": report["jobs_per_s"],
            "p50_s": report["p50_s"],
            "wall_s": report["wall_s"],
            "alone jobs_per_s": report["direct_jobs_per_s"],
            "alone p50_s": report["direct_p50_s"],
            "ratio": report["ratio"],
            "started (s)": _started(report["started_s"]["platform"], report["started_s"]["direct"]),
            "load": "",
            "where the time goes (median s)": "; ".join(f"{part} {seconds}" for part, seconds in parts.items()),
        }
    )
    return rows


def headline(rows: list[dict]) -> Headline:
    median = row_where(rows, round="median")
    return Headline(
        f"{median['backend']}: {median['jobs_per_s']} jobs/s, p50 {median['p50_s']} s, ratio {median['ratio']}",
        f"{median['backend']} alone {median['alone jobs_per_s']} jobs/s, p50 {median['alone p50_s']} s",
    )


def run() -> list[dict]:
    """Each backend in a process of its own, on the Redis broker its workers use too."""
    env = {**os.environ, "DATABASE_URL": database_url(settings.DATABASES["default"]), "REDIS_URL": REDIS_URL}
    rows = []
    for backend, requests in RUNS:
        command = [sys.executable, "-m", "bench", "execution", "--backend", backend, "--requests", str(requests)]
        answer = subprocess.run(
            [*command, "--workers", str(WORKERS), "--rounds", str(ROUNDS), "--json"],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        rows += rows_of(json.loads(answer.stdout.strip().splitlines()[-1]))
    return rows


def _started(platform: list[float | None], direct: list[float | None]) -> str:
    """When each side's workload starts (submissions) began and were all done (None: a side that started none)."""
    return f"{platform[0]} -> {platform[1]}; alone {direct[0]} -> {direct[1]}"
