"""python -m bench gang_replay [--json] --force

Where gangs land on the real test Slurm cluster (issue 33): one small fixed sequence replayed straight through Slurm
and through the platform, and where each put every job. The cluster is devcluster/slurm_cluster.py's with 6 nodes of
2 fake GPUs (gpu:a100:2) under two leaf switches of three nodes (s1, s2) and one spine (topology.conf,
TopologyPlugin=topology/tree); its scheduler tuned as bench/execution_runtimes.py does, and its backfill every
second (bf_interval=1: the jobs behind a waiting one are looked at within the settle time, not after 30 s).

The sequence (SEQUENCE): twelve jobs in nine steps; at each step the jobs ending then end first (a running one is
cancelled or released, as work that finished early; one still waiting withdraws), then the step's arrivals come one
after the other, in order; after each event the system settles and is read. A job's time limit (minutes in Slurm,
hours of approved term on the platform: only their order matters, the replay lasts about a minute) is ten times the
step it ends at.

- Slurm: each job is an `sbatch` of `sleep infinity` with `-N <nodes> --gres=gpu:a100:<cards>` (per node),
  `--ntasks-per-node=1`, the CPUs and memory per node, the time limit, and `--switches=1` for a required rack (a
  preferred rack asks nothing: topology/tree already takes the lowest switch level that can hold the job). Slurm
  has settled when its jobs' states and nodes stayed the same for SETTLED_S and none is completing.
- The platform: the same jobs as orders of multi-node specs (node count, cards per node, rack required or
  preferred) into the scheduling cycle, provisioned as Slurm jobs on the same cluster (the gang one multi-node job
  pinned to the nodes the platform chose), tasks run inline (Q_CLUSTER sync), the nodes and racks imported from
  Slurm and its topology.conf (`import_inventory --from-slurm`); an end is a release, a withdrawal a cancel; a cycle
  after each event (production runs one on every submission and end). Settled: no order between placement and
  active or releasing, and every active order's Slurm job running.

Where each job ran is the NodeList of its Slurm job (squeue %N, as `scontrol show job` shows it); for the platform
the nodes its books hold must be the same (`books_disagree` names the jobs where they were not). Reported per job:
each system's nodes and their switches, whether the job kept to one switch, the step it started; after each event,
how many jobs each had running and waiting; per system, the gangs kept in one switch, the required-rack violations,
the jobs that never started and the waiting counts summed over the events (job-events spent waiting).
"""

import json
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test.utils import override_settings
from django_q.conf import Conf

from bench.execution_runtimes import SLURM_SCHEDULER_PARAMETERS, slurm_settings, tune_scheduler
from bench.headline import table
from bench.shop import bench_service
from catalog.choices import AcceleratorKind, Interconnect, TopologyLevel, TopologyMode
from catalog.models import AcceleratorModel, ResourceSpec, Vendor
from devcluster.slurm_cluster import running_cluster
from provisioning.drivers.slurm import JOB_COMMENT
from provisioning.engine import steps_resume_due
from requests import services as request_services
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.orders import Order
from scheduling.choices import AllocationState
from scheduling.cycle import run_cycle
from scheduling.models import Allocation
from scheduling.slurm.topology import expand_hostlist
from tenancy.models import User
from tenancy.services import project_create, tenant_create

NODES, LEAF_SWITCHES = 6, 2
CPUS_PER_NODE, MEMORY_GB_PER_NODE = 2, 4  # what every job asks of each of its nodes
REQUIRED, PREFERRED = "required", "preferred"
SETTLED_S = 2.0  # unchanged this long: two backfill passes at bf_interval=1
SETTLE_TIMEOUT_S = 60.0
LIMIT_PER_STEP = 10  # minutes of time limit (Slurm), hours of term (platform), per step until the job's end


@dataclass(frozen=True)
class Job:
    name: str
    nodes: int
    cards: int  # per node
    rack: str  # REQUIRED, PREFERRED, or "" for one node
    arrives: int  # the step it arrives at
    ends: int | None  # the step it ends at (None: runs past the replay)

    @property
    def limit(self) -> int:
        return LIMIT_PER_STEP * (self.ends or LAST_STEP + 1)


# 6 nodes x 2 cards in s1 (n1-n3) and s2 (n4-n6). Step 1 fills one switch with a single card and a 2-node gang
# and takes two nodes of the other; b's end (step 2) leaves one switch with a half-used node and two free ones, the
# other with one free node: where the single card d goes decides whether the whole-node job e and the gang f after it
# both fit at once. g needs a whole switch and waits, with h behind it; then ends free nodes step by step and the
# later gangs (i, j, k) choose between a partly used switch and a free one.
SEQUENCE = (
    Job("a", 1, 1, "", 1, 6),
    Job("b", 2, 2, REQUIRED, 1, 2),
    Job("c", 2, 2, REQUIRED, 1, 5),
    Job("d", 1, 1, "", 2, 7),
    Job("e", 1, 2, "", 2, 4),
    Job("f", 2, 2, REQUIRED, 2, 8),
    Job("g", 3, 2, REQUIRED, 3, 9),
    Job("h", 2, 1, PREFERRED, 4, 7),
    Job("i", 2, 2, PREFERRED, 5, 9),
    Job("j", 3, 2, REQUIRED, 7, None),
    Job("k", 2, 2, REQUIRED, 8, None),
    Job("l", 1, 2, "", 9, None),
)
LAST_STEP = max(max(job.arrives, job.ends or 0) for job in SEQUENCE)

WAITING = None  # a job's place in a snapshot while it waits; a running job's is its nodes


def events(sequence=SEQUENCE) -> list[tuple[int, str, Job]]:
    """(step, "end" | "arrive", job) in the order the replay plays them: per step the ends, then the arrivals, each
    in the sequence's order."""
    last = max(max(job.arrives, job.ends or 0) for job in sequence)
    ordered = []
    for step in range(1, last + 1):
        ordered += [(step, "end", job) for job in sequence if job.ends == step]
        ordered += [(step, "arrive", job) for job in sequence if job.arrives == step]
    return ordered


class System(Protocol):
    """What the replay drives: Slurm itself, or the platform. A snapshot maps each job present (arrived, not ended)
    to its nodes while it runs, WAITING while it waits."""

    def arrive(self, job: Job) -> None: ...

    def end(self, job: Job) -> None: ...

    def settle(self) -> None: ...

    def snapshot(self) -> dict[str, tuple[str, ...] | None]: ...


def replay(system: System, sequence=SEQUENCE) -> list[dict]:
    """Play the sequence on the system: after each event, what it had running and waiting."""
    played = []
    for step, kind, job in events(sequence):
        (system.end if kind == "end" else system.arrive)(job)
        system.settle()
        played.append({"step": step, "event": kind, "job": job.name, "jobs": system.snapshot()})
    return played


def compare(sequence, switches: dict[str, tuple[str, ...]], slurm: list[dict], platform: list[dict]) -> dict:
    """Per job, where each system ran it (the nodes it started on), their switches, whether it kept to one switch
    and the step it started; after each event, how many jobs each had running and waiting; each system's totals.
    The two replays played the same events (`replay`)."""
    switch_of = {node: switch for switch, nodes in switches.items() for node in nodes}
    systems = {"slurm": slurm, "platform": platform}
    jobs = {
        job.name: {
            "job": _shape(job),
            "arrives": job.arrives,
            "ends": job.ends,
            **{name: _placement(job, played, switch_of) for name, played in systems.items()},
        }
        for job in sequence
    }
    return {
        "jobs": jobs,
        "events": [
            {
                "step": on_slurm["step"],
                "event": on_slurm["event"],
                "job": on_slurm["job"],
                **{f"slurm_{what}": count for what, count in _counts(on_slurm).items()},
                **{f"platform_{what}": count for what, count in _counts(on_platform).items()},
            }
            for on_slurm, on_platform in zip(slurm, platform, strict=True)
        ],
        "totals": {name: _totals(sequence, jobs, name, played) for name, played in systems.items()},
    }


def _shape(job: Job) -> str:
    rack = f", rack {job.rack}" if job.rack else ""
    return f"{job.nodes}x{job.cards}{rack}"


def _placement(job: Job, played: list[dict], switch_of: dict[str, str]) -> dict:
    started = next(((event["step"], event["jobs"][job.name]) for event in played if event["jobs"].get(job.name)), None)
    if started is None:
        return {"nodes": [], "switches": [], "one_switch": None, "started": None}
    step, nodes = started
    switches = sorted({switch_of[node] for node in nodes})
    return {"nodes": sorted(nodes), "switches": switches, "one_switch": len(switches) == 1, "started": step}


def _counts(event: dict) -> dict[str, int]:
    places = list(event["jobs"].values())
    waiting = sum(place is WAITING for place in places)
    return {"running": len(places) - waiting, "waiting": waiting}


def _totals(sequence, jobs: dict, name: str, played: list[dict]) -> dict:
    """Gangs that ran, and of them those in one switch and those outside their required rack; the jobs that never
    started; the waiting counts after each event, summed (job-events spent waiting)."""
    ran = [job for job in sequence if job.nodes > 1 and jobs[job.name][name]["started"] is not None]
    return {
        "gangs_ran": len(ran),
        "gangs": sum(job.nodes > 1 for job in sequence),
        "gangs_in_one_switch": sum(jobs[job.name][name]["one_switch"] for job in ran),
        "required_violations": sum(not jobs[job.name][name]["one_switch"] for job in ran if job.rack == REQUIRED),
        "never_started": sorted(job.name for job in sequence if jobs[job.name][name]["started"] is None),
        "waiting_after_events": sum(_counts(event)["waiting"] for event in played),
    }


# -- Slurm itself ----------------------------------------------------------------------------------------------------


def squeue(cluster) -> dict[str, tuple[str, str, str, str]]:
    """Job id -> (name, state, NodeList, comment) of every job slurmctld knows."""
    output = cluster.run("squeue", "--noheader", "--states=all", "--format=%i|%j|%T|%N|%k").stdout
    jobs = {}
    for line in output.splitlines():
        job_id, name, state, nodes, comment = line.strip().split("|", 4)
        jobs[job_id] = (name, state, nodes, comment)
    return jobs


def _running_on(state: str, nodes: str) -> tuple[str, ...] | None:
    return tuple(expand_hostlist(nodes)) if state == "RUNNING" else WAITING


class SlurmItself:
    """Each job an sbatch (module docstring); settled once squeue shows the same for SETTLED_S."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.ids: dict[str, str] = {}

    def arrive(self, job: Job) -> None:
        options = [
            "--parsable",
            f"--job-name=replay-{job.name}",
            f"--partition={self.cluster.partition}",
            f"--nodes={job.nodes}",
            f"--gres=gpu:{self.cluster.node_shape.gpu_type}:{job.cards}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={CPUS_PER_NODE}",
            f"--mem={MEMORY_GB_PER_NODE}G",
            f"--time={job.limit}",
            f"--chdir={self.cluster.root}",
            "--output=/dev/null",
            *(["--switches=1"] if job.rack == REQUIRED else []),
        ]
        answer = self.cluster.run("sbatch", *options, "--wrap=exec sleep infinity").stdout
        self.ids[job.name] = answer.strip().split(";")[0]

    def end(self, job: Job) -> None:
        self.cluster.scancel(self.ids.pop(job.name))

    def settle(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        last, since = squeue(self.cluster), time.monotonic()
        while _busy(last) or time.monotonic() - since < SETTLED_S:
            if time.monotonic() > deadline:
                raise CommandError(f"Slurm did not settle within {SETTLE_TIMEOUT_S} s: {last}")
            time.sleep(0.25)
            if (now := squeue(self.cluster)) != last:
                last, since = now, time.monotonic()

    def snapshot(self) -> dict[str, tuple[str, ...] | None]:
        jobs = squeue(self.cluster)
        return {name: _running_on(*jobs[job_id][1:3]) for name, job_id in self.ids.items()}


def _busy(jobs: dict) -> bool:
    return any(state in ("COMPLETING", "CONFIGURING") for _name, state, _nodes, _comment in jobs.values())


# -- the platform ----------------------------------------------------------------------------------------------------

SITE = "replay"


class ThePlatform:
    """The cluster's nodes imported from Slurm (a rack per leaf switch), a spec per job shape, a developer whose
    project holds every card; orders submitted, released and cancelled through the request services. Where a job
    runs is its Slurm job's NodeList; `books_disagree` names the jobs whose allocations said otherwise."""

    def __init__(self, cluster, sequence=SEQUENCE):
        self.cluster = cluster
        self.requests: dict[str, ResourceRequest] = {}
        self.books_disagree: set[str] = set()
        self.order_for, self.developer = _catalog(cluster, sequence)

    def arrive(self, job: Job) -> None:
        self.requests[job.name] = request_services.request_submit(order=self.order_for(job), requester=self.developer)

    def end(self, job: Job) -> None:
        request = ResourceRequest.objects.get(pk=self.requests.pop(job.name).pk)
        if request.state == RequestState.ACTIVE:
            request_services.request_release(request=request, actor=self.developer, reason="replay: ended")
        else:
            request_services.request_cancel(request=request, actor=self.developer, reason="replay: withdrawn")

    def settle(self) -> None:
        run_cycle()
        moving = (RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.RELEASING)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while ResourceRequest.objects.filter(requester=self.developer, state__in=moving).exists():
            if time.monotonic() > deadline:
                raise CommandError(f"The platform did not settle within {SETTLE_TIMEOUT_S} s.")
            steps_resume_due()  # a step that waits longer than a task sleeps comes back through the sweeper
            time.sleep(0.25)

    def snapshot(self) -> dict[str, tuple[str, ...] | None]:
        states = dict(ResourceRequest.objects.filter(requester=self.developer).values_list("pk", "state"))
        in_slurm = {}
        for _name, state, nodes, comment in squeue(self.cluster).values():
            if (named := JOB_COMMENT.match(comment)) and state == "RUNNING":
                in_slurm[int(named["request"])] = tuple(expand_hostlist(nodes))
        places = {}
        for name, request in self.requests.items():
            places[name] = in_slurm.get(request.pk, WAITING) if states[request.pk] == RequestState.ACTIVE else WAITING
            books = Allocation.objects.filter(request_id=request.pk, state=AllocationState.ACTIVE)
            if sorted(books.values_list("node__name", flat=True)) != sorted(places[name] or ()):
                self.books_disagree.add(name)
        return places


def _catalog(cluster, sequence) -> tuple[Callable[[Job], Order], User]:
    """The cluster's GPU type as a catalog model, its nodes imported from Slurm and its topology.conf, a spec per job
    shape, a service offering them, a developer of a project with room for the whole sequence at once (waiting
    orders count against quota too); the order for a job."""
    gpu_type = cluster.node_shape.gpu_type
    accelerator = AcceleratorModel.objects.create(
        slug=gpu_type,
        vendor=Vendor.objects.get(slug="nvidia"),
        name=f"{gpu_type.upper()} (gang replay)",
        kind=AcceleratorKind.GPU,
        memory_gb=80,
        interconnect=Interconnect.PCIE,
    )
    with open(os.devnull, "w") as quiet:
        call_command("import_inventory", "--from-slurm", "--site", SITE, stdout=quiet)
    developer = User.objects.create_user("replay-developer", password=None)
    tenant = tenant_create(name="Gang replay", slug="gang-replay", actor=None)
    cards, nodes = sum(job.nodes * job.cards for job in sequence), sum(job.nodes for job in sequence)
    project = project_create(
        tenant=tenant,
        name="Gang replay",
        slug="gang-replay",
        lead=developer,
        cost_centre="BENCH",
        quota={
            "gpus": Decimal(cards),
            "accelerator_memory_gb": cards * accelerator.memory_gb,
            "cpu_cores": nodes * CPUS_PER_NODE,
            "memory_gb": nodes * MEMORY_GB_PER_NODE,
            "concurrent_tasks": len(sequence),
            "monthly_card_hours": Decimal(10**6),
        },
        actor=None,
    )
    longest = max(job.limit for job in sequence)
    specs = {}
    for nodes, cards_per_node, rack in sorted({(job.nodes, job.cards, job.rack) for job in sequence}):
        spec = ResourceSpec.objects.create(
            name=f"Replay {nodes}x{cards_per_node} {rack or 'one node'}",
            slug=f"replay-{nodes}x{cards_per_node}-{rack or 'node'}",
            accelerator_count=cards_per_node,
            cpu_cores=CPUS_PER_NODE,
            memory_gb=MEMORY_GB_PER_NODE,
            node_count=nodes,
            topology_level=TopologyLevel.RACK if rack else TopologyLevel.NODE,
            topology_mode=TopologyMode.PREFERRED if rack == PREFERRED else TopologyMode.REQUIRED,
            hourly_price=Decimal("1.00"),
            max_duration_hours=longest,
        )
        spec.accelerator_models.set([accelerator])
        specs[nodes, cards_per_node, rack] = spec
    service, image = bench_service(
        name="Gang replay",
        slug="gang-replay",
        specs=list(specs.values()),
        accelerator=accelerator,
        max_duration_hours=longest,
    )

    def order_for(job: Job) -> Order:
        spec = specs[job.nodes, job.cards, job.rack]
        return Order(service=service, project=project, duration_hours=job.limit, spec=spec, image=image)

    return order_for, developer


@contextmanager
def tasks_inline():
    """Provisioning's tasks run in this process as they are enqueued (Q_CLUSTER sync), as the tests run them."""
    sync, Conf.SYNC = Conf.SYNC, True
    try:
        yield
    finally:
        Conf.SYNC = sync


# -- the command -----------------------------------------------------------------------------------------------------


class Command(BaseCommand):
    help = "Replay a small fixed sequence of jobs and gangs through Slurm and through the platform (issue 33)."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", dest="as_json")
        parser.add_argument("--force", action="store_true", help="Run on a database not named *_bench.")

    def handle(self, *args, as_json: bool, force: bool, **options):
        if not force and not str(connection.settings_dict["NAME"]).endswith("_bench"):
            raise CommandError("This adds nodes and orders: point DATABASE_URL at a *_bench database or pass --force.")
        began, load = time.monotonic(), os.getloadavg()[0]
        with running_cluster(node_count=NODES, leaf_switches=LEAF_SWITCHES, name_prefix="replay") as cluster:
            tune_scheduler(cluster, f"{SLURM_SCHEDULER_PARAMETERS},bf_interval=1")
            slurm = replay(SlurmItself(cluster))
            cluster.reset()
            with override_settings(**slurm_settings(cluster)), tasks_inline():
                platform = ThePlatform(cluster)
                platform_steps = replay(platform)
            report = compare(SEQUENCE, cluster.switches, slurm, platform_steps)
            short = {node: node.rsplit("-", 1)[1] for node in cluster.node_names}
        report["switches"] = {switch: [short[node] for node in nodes] for switch, nodes in cluster.switches.items()}
        report["books_disagree"] = sorted(platform.books_disagree)
        report["seconds"] = round(time.monotonic() - began, 1)
        report["load_avg"] = {"start": round(load, 2), "end": round(os.getloadavg()[0], 2)}
        _shorten(report["jobs"], short)
        self.stdout.write(json.dumps(report) if as_json else "\n".join(rows_text(report)))


def _shorten(jobs: dict, short: dict[str, str]) -> None:
    """The cluster's node names (<cluster>-n1) as n1, ... in the report."""
    for job in jobs.values():
        for system in ("slurm", "platform"):
            job[system]["nodes"] = [short[node] for node in job[system]["nodes"]]


def rows(report: dict) -> list[dict]:
    """One row per event: an arrival with where each system ran the job (and the step, when it waited), an end;
    and after it, each system's running / waiting jobs."""
    return [
        {
            "step": event["step"],
            "event": _event_text(event, report["jobs"][event["job"]]),
            "slurm: nodes (switch)": _where(event, report["jobs"][event["job"]]["slurm"]),
            "platform: nodes (switch)": _where(event, report["jobs"][event["job"]]["platform"]),
            "slurm run/wait": f"{event['slurm_running']}/{event['slurm_waiting']}",
            "platform run/wait": f"{event['platform_running']}/{event['platform_waiting']}",
        }
        for event in report["events"]
    ]


def _event_text(event: dict, job: dict) -> str:
    return f"{event['job']} arrives ({job['job']})" if event["event"] == "arrive" else f"{event['job']} ends"


def _where(event: dict, placement: dict) -> str:
    if event["event"] == "end":
        return "-"
    if placement["started"] is None:
        return "never ran"
    where = f"{','.join(placement['nodes'])} ({'+'.join(placement['switches'])})"
    return where if placement["started"] == event["step"] else f"waits; step {placement['started']}: {where}"


def rows_text(report: dict) -> list[str]:
    return [table(rows(report)), "", json.dumps(report["totals"])]
