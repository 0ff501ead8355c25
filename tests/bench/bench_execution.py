"""Execution backends end to end: approved one-GPU requests from queued to RUNNING/active on a real local runtime."""

import json
import os
import subprocess
import sys

from django.conf import settings

from config.env import database_url

TITLE = "Execution backends: queued to active"
# (backend, requests): every backend of `manage.py bench_execution` that has a local runtime here.
RUNS = [("slurm", 100)]
WORKERS = 8
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
DESCRIPTION = (
    "`manage.py bench_execution --backend <backend> --requests <n> --json`: the backend's real local runtime is "
    "started (slurm: tests/slurm_cluster.py, four `slurmd -N` nodes with room for every request at once, "
    "slurmrestd with JWT, `SchedulerParameters=sched_min_interval=100000,batch_sched_delay=0`), its nodes enter "
    f"the inventory, n approved one-GPU requests are queued, a real `qcluster` ({WORKERS} workers, Redis broker) "
    "runs provisioning, and one scheduling cycle places them all. Each request's time is from the cycle's start to "
    "its `active` event (its job RUNNING on the node the platform chose); wall_s is the last one's, jobs_per_s = "
    "active / wall_s. Targets: >= 40 jobs/s for Slurm, p50 <= 5 s. Platform, workers, PostgreSQL, Redis and the "
    "Slurm daemons share the machine's cores with whatever else runs on it."
)


def run() -> list[dict]:
    """Each backend in a process of its own, on the Redis broker its workers use too."""
    env = {**os.environ, "DATABASE_URL": database_url(settings.DATABASES["default"]), "REDIS_URL": REDIS_URL}
    rows = []
    for backend, requests in RUNS:
        command = [sys.executable, "manage.py", "bench_execution", "--backend", backend, "--requests", str(requests)]
        answer = subprocess.run(
            [*command, "--workers", str(WORKERS), "--json"],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(answer.stdout.strip().splitlines()[-1]))
    return rows
