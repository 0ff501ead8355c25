"""Expected starts side by side with Slurm's own (issue 35): one small fixed workload queued through the real test
Slurm cluster (devcluster/slurm_cluster.py: 3 nodes of 2 GPUs) and through the platform's scheduling cycle on a fleet
of the same shape, each estimate compared with the start that system actually gave the job.

- Slurm: each job is submitted at its moment with its time limit and runs `sleep` for its recorded run time (it ends
  early); the estimate is the first StartTime Slurm shows for it while it pends (what `squeue --start` prints; Slurm
  works it out in its backfill pass, so it appears up to `bf_interval`, 30 s by default, after submission; a job that
  starts before shows none: "unknown"); the start is the StartTime once it runs. Real time, Slurm's clock.
- The platform: the same jobs as orders whose term is the time limit, one hour of term per minute of limit (every
  time scaled 60 times: the platform's terms are whole hours), a cycle at each submission and each end as in
  production, in simulated time; the estimate is the likely start the cycle stored at submission. Other runs of
  jobs of the same kinds (`HISTORY`) go through first: the ended work the forecast learns early ends from, with
  what ends during the measured pass (Slurm's estimate has no such history: it takes every running job to its
  limit).

Errors are |estimate - start| as a share of the job's wait (submission -> start), for jobs that waited.
"""

import json
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import time_machine
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from bench import fleet, scale
from bench.start_accuracy import quantile
from bench.steady import release_ended
from devcluster.slurm_cluster import running_cluster
from requests.models import ResourceRequest
from scheduling.cycle import run_cycle
from scheduling.slurm.api import SlurmApi

PLATFORM_SCALE = 60  # platform seconds per Slurm second (a minute of time limit is an hour of term)
AT_ONCE_S = 5  # a start this soon (in Slurm seconds) is at once: Slurm starts even a job that fits on its next pass
NODE_MODEL = "A10"  # the openb model of the platform's three 2-GPU nodes (Slurm's are typed a100: the name differs)


@dataclass(frozen=True)
class Job:
    name: str
    gpus: int
    limit_min: int  # the time limit (Slurm), the term in hours (platform)
    runs_s: int  # when it ends by itself, seconds after it started
    at_s: int  # submitted this long after the first


# 24 jobs of five kinds (cards x time limit) on 6 GPUs, whose recorded run times end at 21 % to 92 % of their limit,
# most well before it (as work on shared clusters does): eight at once fill the cluster and queue, the rest arrive
# every 10 s. About five minutes on Slurm.
WORKLOAD = (
    Job("a", 2, 3, 60, 0),
    Job("b", 2, 2, 35, 0),
    Job("c", 1, 2, 110, 0),
    Job("d", 1, 3, 45, 0),
    Job("e", 2, 2, 60, 0),
    Job("f", 1, 1, 25, 0),
    Job("g", 2, 3, 110, 0),
    Job("h", 1, 2, 40, 0),
    Job("i", 1, 1, 55, 10),
    Job("j", 2, 2, 25, 20),
    Job("k", 1, 3, 100, 30),
    Job("l", 1, 2, 30, 40),
    Job("m", 2, 3, 50, 50),
    Job("n", 1, 1, 20, 60),
    Job("o", 2, 2, 80, 70),
    Job("p", 1, 2, 70, 80),
    Job("q", 1, 1, 40, 90),
    Job("r", 2, 3, 70, 100),
    Job("s", 1, 3, 60, 110),
    Job("t", 2, 2, 45, 120),
    Job("u", 1, 1, 15, 130),
    Job("v", 1, 2, 50, 140),
    Job("w", 2, 3, 40, 150),
    Job("x", 1, 1, 30, 160),
)
# What ran before on the platform (its history of early ends): other runs of four of those kinds, from three ended
# terms of a kind to one; the fifth kind (1 card, 3 minutes) is new.
HISTORY = (
    Job("1a", 1, 1, 30, 0),
    Job("1b", 1, 1, 50, 0),
    Job("1c", 1, 1, 20, 0),
    Job("2a", 1, 2, 60, 0),
    Job("2b", 1, 2, 35, 0),
    Job("3a", 2, 2, 90, 0),
    Job("3b", 2, 2, 30, 0),
    Job("3c", 2, 2, 50, 0),
    Job("4a", 2, 3, 80, 0),
)


@dataclass(frozen=True)
class Observed:
    """One job on one system, in that system's seconds from its submission: its first estimate (None: unknown) and
    its start."""

    name: str
    estimate_s: float | None
    start_s: float


def errors(observed: list[Observed], scale_s: float = 1.0) -> dict:
    """Median and p90 error share over the jobs that waited, how many waited, started at once or had no estimate;
    and each job's wait and estimate in Slurm seconds (`scale_s` of the system's seconds each)."""
    waited = [job for job in observed if job.start_s > AT_ONCE_S * scale_s]
    shares = [abs(job.estimate_s - job.start_s) / job.start_s for job in waited if job.estimate_s is not None]
    return {
        "waited": len(waited),
        "started_at_once": len(observed) - len(waited),
        "unknown": sum(job.estimate_s is None for job in waited),
        "median_error_share": quantile(shares, 0.5),
        "p90_error_share": quantile(shares, 0.9),
        "jobs": {
            job.name: {
                "waited_s": round(job.start_s / scale_s, 1),
                "estimate_s": None if job.estimate_s is None else round(job.estimate_s / scale_s, 1),
            }
            for job in observed
        },
    }


# -- Slurm -----------------------------------------------------------------------------------------------------------


def on_slurm(cluster, workload=WORKLOAD, *, poll_s: float = 0.5, timeout_s: float = 900) -> list[Observed]:
    """Run the workload on the real cluster (`devcluster.slurm_cluster.SlurmCluster`, idle) and watch squeue."""
    due = sorted(workload, key=lambda job: job.at_s)
    names, submitted, estimates, starts = {}, {}, {}, {}
    began = time.monotonic()
    with SlurmApi(url=cluster.rest_url, user_name=cluster.user_name, token=cluster.token) as api:
        while len(starts) < len(workload):
            elapsed = time.monotonic() - began
            if elapsed > timeout_s:
                raise TimeoutError(f"Slurm started {len(starts)} of {len(workload)} jobs in {timeout_s} s")
            while due and due[0].at_s <= elapsed:
                job = due.pop(0)
                names[api.submit_job(f"#!/bin/sh\nsleep {job.runs_s}\n", _slurm_job(cluster, job))["job_id"]] = job
            for job_id, state, submit, start in _squeue(cluster):
                if job_id not in names:
                    continue
                submitted[job_id] = submit
                if state == "PENDING" and start is not None:
                    estimates.setdefault(job_id, start)
                elif state != "PENDING" and start is not None:
                    starts[job_id] = start
            time.sleep(poll_s)
    return [
        Observed(
            names[job_id].name,
            None if job_id not in estimates else (estimates[job_id] - submitted[job_id]).total_seconds(),
            (start - submitted[job_id]).total_seconds(),
        )
        for job_id, start in starts.items()
    ]


def _slurm_job(cluster, job: Job) -> dict:
    return {
        "name": f"accuracy-{job.name}",
        "partition": cluster.partition,
        "gres": f"gpu:{cluster.node_shape.gpu_type}:{job.gpus}",
        "time_limit": job.limit_min,
        "current_working_directory": str(cluster.job_dir),
        "environment": {"PATH": "/usr/bin:/bin"},
    }


def _squeue(cluster) -> list[tuple[int, str, datetime, datetime | None]]:
    """(job id, state, submitted, start or expected start) of every job squeue knows, ended ones included."""
    output = cluster.run("squeue", "--noheader", "--states=all", "--format=%i|%T|%V|%S").stdout
    rows = []
    for line in output.splitlines():
        job_id, state, submit, start = line.strip().split("|")
        moment = None if start in ("N/A", "Unknown", "None") else datetime.fromisoformat(start)
        rows.append((int(job_id), state, datetime.fromisoformat(submit), moment))
    return rows


# -- the platform ----------------------------------------------------------------------------------------------------


def on_platform(workload=WORKLOAD, *, history=HISTORY, node_list: Path) -> list[Observed]:
    """Run `history` then `workload` through the scheduling cycle (simulated time) on three 2-GPU nodes; the second
    pass is observed. Needs an empty scratch database (the bench's, or a test's)."""
    node_list.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"accuracy-node-{n},32000,262144,2,{NODE_MODEL}\n" for n in range(3))
    )
    scale.import_fleet(node_list, 1)
    shapes = {
        job.name: fleet.PodShape(job.gpus, 1000, 4, 16, (), "LS", job.runs_s * PLATFORM_SCALE)
        for job in (*history, *workload)
    }
    orders = scale.Workload(list(shapes.values()), projects=1)
    start = timezone.now()
    with time_machine.travel(start, tick=False) as traveller:
        ended, _observed = _platform_pass(history, shapes, orders, traveller, start, 0.0)
        _ended, observed = _platform_pass(workload, shapes, orders, traveller, start, ended)
    return observed


def _platform_pass(workload, shapes, orders, traveller, start, began: float):
    """One pass from `began` (simulated seconds after `start`) until every job ended: its observations, its end."""
    arrivals = sorted(((began + job.at_s * PLATFORM_SCALE, job) for job in workload), key=lambda pair: pair[0])
    ends: list[tuple[float, int]] = []
    jobs, submitted, estimates, starts = {}, {}, {}, {}
    now = began
    while arrivals or ends:
        now = min([moment for moment, _job in arrivals[:1]] + [moment for moment, _pk in ends])
        traveller.move_to(start + timedelta(seconds=now))
        release_ended([pk for moment, pk in ends if moment <= now])
        ends = [(moment, pk) for moment, pk in ends if moment > now]
        new = []
        while arrivals and arrivals[0][0] <= now:
            _moment, job = arrivals.pop(0)
            order = fleet.SyntheticRequest(shapes[job.name], "standard", 0, job.limit_min)
            (pk,) = orders.queue([order], created_at=start + timedelta(seconds=now))
            jobs[pk], submitted[pk] = job, now
            new.append(pk)
        result = run_cycle()
        for pk in result.allocated:
            starts[pk] = now
            ends.append((now + jobs[pk].runs_s * PLATFORM_SCALE, pk))
        for pk, estimate in ResourceRequest.objects.filter(pk__in=set(new) - set(result.allocated)).values_list(
            "pk", "queue_estimate"
        ):
            likely = (estimate or {}).get("likely")
            estimates[pk] = None if likely is None else (datetime.fromisoformat(likely) - start).total_seconds()
    observed = [
        Observed(
            jobs[pk].name,
            0.0 if pk not in estimates else None if estimates[pk] is None else estimates[pk] - submitted[pk],
            starts[pk] - submitted[pk],
        )
        for pk in jobs
    ]
    return now, observed


# -- the command -----------------------------------------------------------------------------------------------------


class Command(BaseCommand):
    help = "Expected starts side by side with Slurm's squeue --start on one small fixed workload (issue 35)."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="Run on a database not named *_bench.")

    def handle(self, *args, force: bool, **options):
        if not force and not str(connection.settings_dict["NAME"]).endswith("_bench"):
            raise CommandError(
                "This adds a fleet and orders: point DATABASE_URL at a *_bench database or pass --force."
            )
        with running_cluster(name_prefix="acc") as cluster:
            slurm = errors(on_slurm(cluster))
        with tempfile.TemporaryDirectory() as scratch:
            platform = errors(on_platform(node_list=Path(scratch) / "nodes.csv"), scale_s=PLATFORM_SCALE)
        self.stdout.write(json.dumps({"slurm": slurm, "platform": platform}))
