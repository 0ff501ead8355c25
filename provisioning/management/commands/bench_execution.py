"""manage.py bench_execution --backend slurm|container --requests 100 [--workers 8] [--json]

End to end on a real execution backend: start the backend's real local runtime (for `slurm`, the test cluster of
tests/slurm_cluster.py; for `container`, this machine's podman, provisioning/bench_execution_container.py; sized so
every request fits at once), put its nodes into the inventory, queue N approved
one-GPU requests, start real `qcluster` workers on this database, then run one scheduling cycle and wait until
every request is active (its workload RUNNING on the backend) or failed. Reports {"backend", "requests",
"active", "wall_s", "jobs_per_s", "p50_s", "p99_s", "worker_cpu_s"}: wall_s from the cycle's start to the last request
active, jobs_per_s = active / wall_s, and p50/p99 of each request's time from that start (all are
queued by then) to active; worker_cpu_s is the CPU time the qcluster's processes used meanwhile (on a loaded
machine wall times stretch, this much less), and backend_cpu_s what the backend's own daemons used (Slurm's).

A backend plugs in as one more entry of BACKENDS: a context manager that starts its runtime and yields a Runtime
(its nodes, and the settings that point the platform at it). It adds a benchmark tenant, nodes and requests: run it
on a scratch database (`make bench` does).
"""

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone
from django_q.models import Schedule
from django_q.tasks import async_task, result

from catalog.choices import AcceleratorKind, Interconnect, ServiceKind
from catalog.models import AcceleratorModel, Image, ResourceSpec, Service, Vendor
from config.env import database_url
from provisioning.bench_execution_container import container_runtime
from requests.choices import EventCode, RequestState
from requests.models import RequestEvent, ResourceRequest
from scheduling.choices import ExecutionBackend
from scheduling.cycle import run_cycle
from scheduling.management.commands.bench_scheduler import queued_request
from scheduling.models import Device, Node
from scheduling.slurm.api import SlurmApi
from tenancy.models import User
from tenancy.services import project_create, tenant_create

SETTLED_STATES = (RequestState.ACTIVE, RequestState.FAILED)
WORKER_START_SECONDS = 60
STOP_SECONDS = 20


@dataclass(frozen=True)
class BenchNode:
    name: str
    cpus: int
    memory_mib: int
    gpu_type: str
    gpus: int


@dataclass(frozen=True)
class Runtime:
    """A running backend: the nodes to put into the inventory, and the settings that point the platform at it."""

    backend: str
    nodes: list[BenchNode]
    settings: dict[str, str]
    image_reference: str = "bench"  # what the backend runs (the container backend builds "containerfile:...")
    parameters: dict = field(default_factory=dict)  # the orders' parameters (a workspace's SSH key)
    daemon_groups: Callable[[], dict[str, int]] = dict  # the backend's own daemons' process groups, to meter


@contextlib.contextmanager
def slurm_runtime(requests: int) -> Iterator[Runtime]:
    """The local Slurm test cluster: eight-GPU nodes (as most GPU servers are), enough of them for all the requests at
    once (1 GPU, 1 CPU, 1 GiB each)."""
    from tests.slurm_cluster import NodeShape, running_cluster

    gpus = SLURM_NODE_GPUS
    node_count = math.ceil(requests / gpus)
    shape = NodeShape(cpus=2 * gpus, real_memory_mib=2048 * gpus, gpus=gpus)
    with running_cluster(node_count=node_count, node_shape=shape, name_prefix="bench") as cluster:
        _tune_scheduler(cluster)
        yield Runtime(
            backend=ExecutionBackend.SLURM,
            nodes=[
                BenchNode(name, shape.cpus, shape.real_memory_mib, shape.gpu_type, gpus) for name in cluster.node_names
            ],
            settings={
                "SLURM_REST_URL": cluster.rest_url,
                "SLURM_USER_NAME": cluster.user_name,
                "SLURM_JWT": cluster.token,
                "SLURM_JWT_FILE": "",
                "SLURM_CONF": str(cluster.slurm_conf),
                "SLURM_PARTITION": cluster.partition,
                "SLURM_JOB_DIRECTORY": str(cluster.job_dir),
            },
            daemon_groups=lambda: cluster.daemon_groups,
        )


SLURM_NODE_GPUS = 8


# Slurm's defaults start a batch job submitted while others run only on a later scheduling pass, about 2.7 s after
# submission here; a site that wants interactive starts tunes this, and so does the benchmark's cluster.
SLURM_SCHEDULER_PARAMETERS = "sched_min_interval=100000,batch_sched_delay=0"
WARM_UP_SECONDS = 30


def _tune_scheduler(cluster) -> None:
    """The tuning above, then one job through the cluster: the first scheduling pass after a reconfiguration comes
    about 2 s late (measured: 25 jobs RUNNING 2.1-2.6 s after submission, the next 25 within 0.5-0.8 s), which a
    cluster in service is long past."""
    with cluster.slurm_conf.open("a") as conf:
        conf.write(f"SchedulerParameters={SLURM_SCHEDULER_PARAMETERS}\n")
    cluster.scontrol("reconfigure")
    with SlurmApi(url=cluster.rest_url, user_name=cluster.user_name, token=cluster.token) as api:
        job_id = api.submit_job(
            "#!/bin/sh\nexec sleep infinity\n",
            {
                "name": "bench-warm-up",
                "nodes": "1",
                "cpus_per_task": 1,
                "memory_per_node": 64,
                "time_limit": 1,
                "current_working_directory": str(cluster.job_dir),
                "environment": {"PATH": "/usr/bin:/bin"},
            },
        )["job_id"]
        deadline = time.monotonic() + WARM_UP_SECONDS
        while api.job(job_id)["job_state"] != "RUNNING":
            if time.monotonic() > deadline:
                raise CommandError(f"Slurm did not start the warm-up job within {WARM_UP_SECONDS} s.")
            time.sleep(0.1)
        api.cancel_job(job_id)


BACKENDS: dict[str, Callable[[int], contextlib.AbstractContextManager[Runtime]]] = {
    ExecutionBackend.SLURM: slurm_runtime,
    ExecutionBackend.CONTAINER: container_runtime,
}


class Command(BaseCommand):
    help = "Measure approved one-GPU requests from queued to active on a real execution backend."

    def add_arguments(self, parser):
        parser.add_argument("--backend", choices=sorted(BACKENDS), required=True)
        parser.add_argument("--requests", type=int, default=100)
        parser.add_argument("--workers", type=int, default=8, help="qcluster worker processes.")
        parser.add_argument("--timeout", type=float, default=300.0, help="Seconds to wait for all to settle.")
        parser.add_argument("--json", action="store_true", dest="as_json")
        parser.add_argument("--force", action="store_true", help="Run on a database not named *_bench.")

    def handle(self, *args, backend, requests, workers, timeout, as_json, force, **options):
        if not force and not str(connection.settings_dict["NAME"]).endswith("_bench"):
            raise CommandError(
                "This adds nodes and requests: point DATABASE_URL at a *_bench database or pass --force."
            )
        with BACKENDS[backend](requests) as runtime, override_settings(**runtime.settings):
            request_ids = _queue(runtime, requests)
            with _workers(workers, runtime.settings) as cpu_seconds:
                started, cpu_before, backend_before = timezone.now(), cpu_seconds(), _daemons_cpu_seconds(runtime)
                run_cycle()
                _wait_until_settled(request_ids, timeout)
                worker_cpu = cpu_seconds() - cpu_before
                backend_cpu = _daemons_cpu_seconds(runtime) - backend_before
            report = _report(runtime.backend, request_ids, started)
            report["worker_cpu_s"] = round(worker_cpu, 2)
            if runtime.daemon_groups():
                report["backend_cpu_s"] = round(backend_cpu, 2)
        self.stdout.write(json.dumps(report) if as_json else "\n".join(f"{k:>10}: {v}" for k, v in report.items()))


def _queue(runtime: Runtime, count: int) -> list[int]:
    """The runtime's nodes in the inventory, and `count` approved one-GPU requests queued for them."""
    stamp = f"{runtime.backend}-{int(time.time())}"
    gpu_type = runtime.nodes[0].gpu_type
    accelerator, _ = AcceleratorModel.objects.get_or_create(
        slug=gpu_type,
        defaults={
            "vendor": Vendor.objects.get(slug="nvidia"),
            "name": f"{gpu_type.upper()} (bench)",
            "kind": AcceleratorKind.GPU,
            "memory_gb": 80,
            "interconnect": Interconnect.PCIE,
        },
    )
    for bench_node in runtime.nodes:
        node = Node.objects.create(
            name=bench_node.name,
            serial_number=f"bench-{bench_node.name}",
            execution_backend=runtime.backend,
            cpu_milli=bench_node.cpus * 1000,
            memory_mib=bench_node.memory_mib,
        )
        Device.objects.bulk_create(
            Device(node=node, index=index, uuid=f"GPU-{bench_node.name}-{index}", model=accelerator, memory_gb=80)
            for index in range(bench_node.gpus)
        )
    requester = User.objects.create_user(f"bench-{stamp}", password=None)
    tenant = tenant_create(name=f"Bench {stamp}", slug=f"bench-{stamp}", actor=None)
    project = project_create(
        tenant=tenant, name=f"Bench {stamp}", slug=f"bench-{stamp}", lead=requester, cost_centre="BENCH", actor=None
    )
    spec = ResourceSpec.objects.create(
        name=f"Bench 1x {stamp}",
        slug=f"bench-1x-{stamp}",
        accelerator_count=1,
        cpu_cores=1,
        memory_gb=1,
        hourly_price=Decimal("1.00"),
        max_duration_hours=24,
    )
    spec.accelerator_models.set([accelerator])
    image = Image.objects.create(
        name=f"bench-{stamp}",
        version="1",
        reference=runtime.image_reference,
        os="linux",
        runtime="cuda",
        approved=True,
    )
    service = Service.objects.create(
        name=f"Bench {stamp}",
        slug=f"bench-{stamp}",
        kind=ServiceKind.COMPUTE,
        description="benchmark",
        default_duration_hours=1,
        max_duration_hours=24,
    )
    service.specs.set([spec])
    service.images.set([image])
    rows = ResourceRequest.objects.bulk_create(
        [queued_request(spec, project, requester, service, image, runtime.parameters) for _ in range(count)]
    )
    return [row.pk for row in rows]


@contextlib.contextmanager
def _workers(count: int, runtime_settings: dict[str, str]) -> Iterator[Callable[[], float]]:
    """A real qcluster on this database and broker, pointed at the runtime; up (it ran a task) before the clock
    starts, stopped by its PID afterwards. Yields a function giving the CPU seconds its processes have used (what the
    platform costs, whatever else loads the machine)."""
    env = {
        **os.environ,
        **runtime_settings,
        "DATABASE_URL": database_url(settings.DATABASES["default"]),
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings"),
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only"),
        "Q_SYNC": "0",
        "Q_WORKERS": str(count),
        "LOG_LEVEL": "WARNING",
    }
    _defer_housekeeping()
    log = Path(tempfile.gettempdir()) / f"bench-execution-qcluster-{os.getpid()}.log"
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        if result(async_task("math.floor", 1.5), wait=WORKER_START_SECONDS * 1000) != 1:
            raise CommandError(f"qcluster did not run a task within {WORKER_START_SECONDS} s; see {log}")
        yield lambda: _group_cpu_seconds(worker.pid)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def _defer_housekeeping() -> None:
    """A fresh database's minute schedules (inventory import, reconciler, sweeper, telemetry, reminders...) are all
    due the moment the cluster starts, and would hold every worker while the clock runs (a running platform spreads
    them over its minutes): on the benchmark's scratch database they wait until it is over."""
    Schedule.objects.update(next_run=timezone.now() + timedelta(hours=1))


def _daemons_cpu_seconds(runtime: Runtime) -> float:
    """CPU seconds the backend's own daemons have used (slurmctld, slurmd, slurmrestd: what the cluster costs)."""
    return sum(_group_cpu_seconds(group) for group in runtime.daemon_groups().values())


def _group_cpu_seconds(group: int) -> float:
    """User + system CPU seconds of the live processes of a process group (Linux /proc)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == group:  # pgrp; utime and stime follow at 11 and 12 (man 5 proc, after the comm field)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _wait_until_settled(request_ids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    unsettled = ResourceRequest.objects.filter(pk__in=request_ids).exclude(state__in=SETTLED_STATES)
    while unsettled.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def _report(backend: str, request_ids: list[int], started) -> dict:
    active_at = RequestEvent.objects.filter(
        request_id__in=request_ids, code=EventCode.ACTIVE, to_state=RequestState.ACTIVE
    ).values_list("created_at", flat=True)
    latencies = sorted((moment - started).total_seconds() for moment in active_at)
    wall = latencies[-1] if latencies else None
    return {
        "backend": backend,
        "requests": len(request_ids),
        "active": len(latencies),
        "wall_s": round(wall, 2) if wall else None,
        "jobs_per_s": round(len(latencies) / wall, 1) if wall else 0.0,
        "p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "p99_s": round(_percentile(latencies, 99), 2) if latencies else None,
    }


def _percentile(ordered: list[float], q: int) -> float:
    """Nearest-rank percentile of an ascending list."""
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
