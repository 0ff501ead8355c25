"""python -m bench execution --backend slurm|container --requests 100 [--workers 8] [--rounds 3] [--json]

End to end on a real execution backend: start the backend's real local runtime (for `slurm`, the test cluster of
devcluster/slurm_cluster.py; for `container`, this machine's podman, bench/execution_runtimes.py; sized so
every request fits at once), put its nodes into the inventory and start real `qcluster` workers on this database.
After one unmeasured wave of the baseline (a fresh runtime's first wave is faster than any later one: slurmctld
holds no finished jobs yet) and one of the platform (fresh workers' first tasks import the code and open their
connections), in each round two measurements on the same runtime, one after the other (their order
alternates from round to round, so neither always meets a warmer, busier or fuller runtime), each begun once the
broker holds no task and neither the workers nor the backend's daemons use more than a trickle of CPU (what the
measurement before left behind, a release's tasks or slurmctld's work after a hundred cancellations, is its own;
`quiet_wait_s` says how long each waited), and then at the round's point of the wall clock's second (`phase_s`:
slurmctld allocates a wave on its background loop's tick at whole seconds, so both measurements of a round meet
the tick at the same point, and the rounds' points spread over the second):

- the platform: N approved one-GPU requests queued, one scheduling cycle, wait until every request is active (its
  workload RUNNING on the backend) or failed; then they are released and the backend is idle again;
- the backend alone (the baseline): the same N workloads started straight on the backend by one client, the way a
  user would: for `slurm` the same batch jobs (script and properties as the platform's driver builds them, pinned
  eight to a node) submitted to the same slurmrestd one after another, each timed to RUNNING (a second connection
  reads the job list every 50 ms); for `container` the same `podman run` (image and options as the driver's) one
  after another, each timed to its sshd answering, as the platform's readiness check waits for; then they are
  cancelled or removed.

Reports {"backend", "requests", "rounds", "active", "wall_s", "jobs_per_s", "p50_s", "p99_s", "worker_cpu_s",
"backend_cpu_s", "direct_jobs_per_s", "direct_p50_s", "ratio", "started_s", "breakdown", "load_avg", "per_round"}:
the platform's figures are the median over the rounds of each round's (wall_s from the cycle's start to the last
request active, jobs_per_s = active / wall_s, p50/p99 of each request's time from that start to active), the
baseline's likewise (from its first submission), ratio the median of the rounds' platform / baseline jobs per
second. started_s is when each side's first workload start began and its last one was done (for `slurm` the
submissions; the platform's from the cycle's start, the baseline's from its first submission): what follows is the
backend starting the workloads and each side seeing it. worker_cpu_s is the CPU time the qcluster's processes used
in the round (on a loaded machine wall times stretch, this much less), backend_cpu_s what the backend's own daemons
used (Slurm's). `breakdown` is where a request's time goes, the median over requests (and then over rounds): the
cycle, the wait for its first step, each step's wait in the task queue and its time in a worker (for `slurm`
start_workload is the submissions' REST calls, workload_ready the job queries while Slurm starts the job;
readiness_check's wait is the record of the submissions and its claim in the same worker, and publish_access is done
inside the readiness record, so its two parts are that record's), and the activation; the baseline's own REST calls
(submission and job-list round trips) beside them. The reconciler and every other schedule are deferred while the
benchmark runs. `load_avg` is the machine's 1-minute load before and after each round.

A backend plugs in as one more entry of BACKENDS (bench/execution_runtimes.py): a context manager that starts its
runtime and yields a Runtime (its nodes, and the settings that point the platform at it), and of DIRECT: its
baseline. It adds a benchmark tenant, nodes and requests: run it on a scratch database (`make bench` does).
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
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.models import Max, Min
from django.test.utils import override_settings
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import Schedule
from django_q.tasks import async_task, result

from bench.execution_runtimes import BACKENDS, Runtime
from bench.scheduler import queued_request
from bench.shop import bench_service
from catalog.choices import AcceleratorKind, Interconnect
from catalog.models import AcceleratorModel, ResourceSpec, Vendor
from config.env import database_url
from provisioning.drivers.base import Target
from provisioning.drivers.slurm import START_STEP
from provisioning.models import ProvisioningStep
from requests.choices import EventCode, RequestState
from requests.models import RequestEvent, ResourceRequest
from requests.services import request_release
from scheduling.choices import ExecutionBackend
from scheduling.cycle import run_cycle
from scheduling.models import Device, Node
from scheduling.slurm.api import SlurmApi
from tenancy.models import User
from tenancy.services import project_create, tenant_create

SETTLED_STATES = (RequestState.ACTIVE, RequestState.FAILED)
GOLDEN_RATIO = (1 + 5**0.5) / 2  # round n begins `n * GOLDEN_RATIO % 1` into a second: the rounds spread over it
WORKER_START_SECONDS = 60
STOP_SECONDS = 20
# Quiet: the workers, and the backend's daemons, used less CPU than this over a window (idle, each uses a little).
QUIET_WINDOW_SECONDS, QUIET_CPU_SECONDS = 0.5, 0.05


class Command(BaseCommand):
    help = (
        "Measure approved one-GPU requests from queued to active on a real execution backend, beside the backend alone."
    )

    def add_arguments(self, parser):
        parser.add_argument("--backend", choices=sorted(BACKENDS), required=True)
        parser.add_argument("--requests", type=int, default=100)
        parser.add_argument("--workers", type=int, default=8, help="qcluster worker processes.")
        parser.add_argument("--rounds", type=int, default=4, help="Platform and baseline measurements, interleaved.")
        parser.add_argument("--timeout", type=float, default=300.0, help="Seconds to wait for all to settle.")
        parser.add_argument("--json", action="store_true", dest="as_json")
        parser.add_argument("--force", action="store_true", help="Run on a database not named *_bench.")

    def handle(self, *args, backend, requests, workers, rounds, timeout, as_json, force, **options):
        if not force and not str(connection.settings_dict["NAME"]).endswith("_bench"):
            raise CommandError(
                "This adds nodes and requests: point DATABASE_URL at a *_bench database or pass --force."
            )
        with BACKENDS[backend](requests) as runtime, override_settings(**runtime.settings):
            orders = _Orders(runtime)
            # Unmeasured: a fresh runtime's first wave is faster than any later one (slurmctld knows no finished
            # jobs yet, podman's caches are cold the other way); a runtime in service is past both.
            DIRECT[backend](runtime, requests, timeout)
            with _workers(workers, runtime.settings) as cpu_seconds:
                # Unmeasured too: fresh workers spend their first tasks importing the provisioning code and opening
                # their connections (about twice a later round's CPU); the workers of a platform in service are past
                # that. The same N requests, the same runtime.
                _wait_until_quiet(runtime, cpu_seconds, timeout)
                _platform(runtime, orders, requests, timeout, cpu_seconds)
                results = []
                for number in range(rounds):
                    load = os.getloadavg()[0]
                    phase = round(number * GOLDEN_RATIO % 1, 3)
                    measure = {
                        "platform": partial(_platform, runtime, orders, requests, timeout, cpu_seconds, phase),
                        "direct": partial(DIRECT[backend], runtime, requests, timeout, phase),
                    }
                    order = ("direct", "platform") if number % 2 == 0 else ("platform", "direct")
                    measured, quiet = {}, {}
                    for name in order:
                        quiet[name] = _wait_until_quiet(runtime, cpu_seconds, timeout)
                        measured[name] = measure[name]()
                    results.append(
                        {
                            "round": number + 1,
                            "first": order[0],
                            "phase_s": phase,
                            **measured,
                            "load_avg": [load],
                            "quiet_wait_s": quiet,
                        }
                    )
                    results[-1]["load_avg"].append(os.getloadavg()[0])
        report = _report(runtime.backend, requests, results)
        self.stdout.write(json.dumps(report) if as_json else "\n".join(f"{k:>18}: {v}" for k, v in report.items()))


class _Orders:
    """The runtime's nodes in the inventory, and what a round's approved one-GPU requests are ordered from."""

    def __init__(self, runtime: Runtime):
        earlier = Node.objects.filter(execution_backend=runtime.backend).values_list("name", flat=True)[:3]
        if earlier:  # the cycle would place on nodes whose runtime is gone, and those orders would fail
            raise CommandError(
                f"The database holds {runtime.backend} nodes of an earlier run ({', '.join(earlier)}, ...): "
                "run the benchmark on a fresh *_bench database."
            )
        stamp = f"{runtime.backend}-{int(time.time())}"
        gpu_type = runtime.nodes[0].gpu_type
        self.accelerator, _ = AcceleratorModel.objects.get_or_create(
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
                Device(
                    node=node, index=index, uuid=f"GPU-{bench_node.name}-{index}", model=self.accelerator, memory_gb=80
                )
                for index in range(bench_node.gpus)
            )
        self.requester = User.objects.create_user(f"bench-{stamp}", password=None)
        tenant = tenant_create(name=f"Bench {stamp}", slug=f"bench-{stamp}", actor=None)
        self.project = project_create(
            tenant=tenant,
            name=f"Bench {stamp}",
            slug=f"bench-{stamp}",
            lead=self.requester,
            cost_centre="BENCH",
            actor=None,
        )
        self.spec = ResourceSpec.objects.create(
            name=f"Bench 1x {stamp}",
            slug=f"bench-1x-{stamp}",
            accelerator_count=1,
            cpu_cores=1,
            memory_gb=1,
            hourly_price=Decimal("1.00"),
            max_duration_hours=24,
        )
        self.spec.accelerator_models.set([self.accelerator])
        self.service, self.image = bench_service(
            name=f"Bench {stamp}",
            slug=f"bench-{stamp}",
            specs=[self.spec],
            accelerator=self.accelerator,
            max_duration_hours=24,
            image_reference=runtime.image_reference,
        )
        self.parameters = runtime.parameters

    def queue(self, count: int) -> list[int]:
        rows = ResourceRequest.objects.bulk_create(
            [
                queued_request(self.spec, self.project, self.requester, self.service, self.image, self.parameters)
                for _ in range(count)
            ]
        )
        return [row.pk for row in rows]


# --- The platform ------------------------------------------------------------------------------------------------


def _platform(
    runtime: Runtime, orders: _Orders, count: int, timeout: float, cpu_seconds, phase: float | None = None
) -> dict:
    """One round through the platform: queue, one cycle (begun at `phase`, `_at_phase`), wait until all are active;
    then release them all and wait until the backend is idle again."""
    request_ids = orders.queue(count)
    _at_phase(phase)
    started, cpu_before, backend_before = timezone.now(), cpu_seconds(), _daemons_cpu_seconds(runtime)
    cycle_started = time.monotonic()
    run_cycle()
    cycle_seconds = time.monotonic() - cycle_started
    _wait_until_settled(request_ids, timeout, SETTLED_STATES)
    measured = {**_timed(request_ids, started), "started_s": _starts_window(request_ids, started)}
    measured["worker_cpu_s"] = round(cpu_seconds() - cpu_before, 2)
    if runtime.daemon_groups():
        measured["backend_cpu_s"] = round(_daemons_cpu_seconds(runtime) - backend_before, 2)
    measured["breakdown"] = _breakdown(request_ids, started, cycle_seconds)
    for request in ResourceRequest.objects.filter(pk__in=request_ids, state=RequestState.ACTIVE):
        request_release(request=request, actor=None, reason="the benchmark's round is over")
    _wait_until_settled(request_ids, timeout, (RequestState.RELEASED, RequestState.FAILED))
    IDLE[runtime.backend](runtime, timeout)
    return measured


def _at_phase(phase: float | None) -> None:
    """Wait until the wall clock is `phase` seconds past a whole second (None: go at once). slurmctld allocates a
    wave on its background loop's tick, at whole seconds of the wall clock (its allocations are logged 0-50 ms past
    the second): the two measurements of a round begin at the same point of the second, so neither meets a tick the
    other missed by luck alone, and the rounds' points spread over the second."""
    if phase is not None:
        time.sleep((phase - time.time()) % 1.0)


def _timed(request_ids: list[int], started) -> dict:
    active_at = RequestEvent.objects.filter(
        request_id__in=request_ids, code=EventCode.ACTIVE, to_state=RequestState.ACTIVE
    ).values_list("created_at", flat=True)
    return _latencies(len(request_ids), [(moment - started).total_seconds() for moment in active_at])


def _starts_window(request_ids: list[int], started) -> list[float | None]:
    """When the round's first workload start began and when its last one was done (its start_workload step's first
    claim and last record; for `slurm`, the submissions), in seconds from the cycle's start: what comes after is the
    backend starting them and the platform seeing it, as for the backend alone. None for a round none got to."""
    window = ProvisioningStep.objects.filter(
        run__request_id__in=request_ids, name=START_STEP, finished_at__isnull=False
    ).aggregate(first=Min("started_at"), last=Max("finished_at"))
    return [
        None if window[edge] is None else round((window[edge] - started).total_seconds(), 2)
        for edge in ("first", "last")
    ]


def _breakdown(request_ids: list[int], started, cycle_seconds: float) -> dict:
    """Where a request's time went, the median over the requests of each part: the cycle, its wait for the first
    step (the run's creation and the task queue), each step's wait in the task queue and its time in a worker, and
    from the last step to active."""
    events = defaultdict(dict)
    for request_id, code, moment in RequestEvent.objects.filter(
        request_id__in=request_ids, code__in=[EventCode.ALLOCATED, EventCode.ACTIVE]
    ).values_list("request_id", "code", "created_at"):
        events[request_id][code] = moment
    steps = defaultdict(list)
    for request_id, name, begun, ended in (
        ProvisioningStep.objects.filter(run__request_id__in=request_ids, finished_at__isnull=False)
        .order_by("run__request_id", "position")
        .values_list("run__request_id", "name", "started_at", "finished_at")
    ):
        steps[request_id].append((name, begun, ended))
    parts = defaultdict(list)
    for request_id, seen in events.items():
        if EventCode.ALLOCATED not in seen or EventCode.ACTIVE not in seen or not steps[request_id]:
            continue
        parts["allocated (cycle)"].append((seen[EventCode.ALLOCATED] - started).total_seconds())
        previous = seen[EventCode.ALLOCATED]
        for name, begun, ended in steps[request_id]:
            parts[f"{name}: queued"].append((begun - previous).total_seconds())
            parts[f"{name}: in a worker"].append((ended - begun).total_seconds())
            previous = ended
        parts["to active"].append((seen[EventCode.ACTIVE] - previous).total_seconds())
    return {
        "cycle_s": round(cycle_seconds, 3),
        **{part: round(statistics.median(values), 3) for part, values in parts.items()},
        "reconciler": "deferred while the benchmark runs (every schedule is pushed an hour ahead)",
    }


# --- The backend alone -------------------------------------------------------------------------------------------


def _image(runtime: Runtime) -> dict:
    """The image as the drivers get it: what the platform's orders run (no configuration of its own)."""
    return {"name": "bench-direct", "version": "1", "reference": runtime.image_reference, "configuration": {}}


def _bench_target(runtime: Runtime, number: int) -> Target:
    """A workload the way the platform's driver describes one: request ids far above the platform's own."""
    per_node = runtime.nodes[0].gpus
    node = runtime.nodes[number // per_node]
    index = number % per_node
    accelerator = AcceleratorModel.objects.get(slug=node.gpu_type)
    return Target(
        run_id=0,
        request_id=DIRECT_IDS + number,
        node=node.name,
        devices=(
            {
                "index": index,
                "uuid": f"GPU-{node.name}-{index}",
                "model": accelerator.name,
                "model_slug": accelerator.slug,
                "milli": 1000,
                "mig": None,
                "mig_changes": {},
            },
        ),
        snapshot={"demand": {"cpu_cores": 1, "memory_gb": 1}, "duration_hours": 1, "parameters": runtime.parameters},
        allocation_id=DIRECT_IDS + number,
        requester="bench-direct",
        duration_hours=1,
    )


def _direct_slurm(runtime: Runtime, count: int, timeout: float, phase: float | None = None) -> dict:
    """The same batch jobs submitted to the same slurmrestd by one client, one after another (the first at `phase`,
    `_at_phase`), each timed from the first submission to RUNNING (a second connection reads the job list every
    50 ms); then cancelled."""
    from provisioning.drivers.slurm import batch_script, job_properties

    image = _image(runtime)
    jobs = []
    for number in range(count):
        target = _bench_target(runtime, number)
        jobs.append((batch_script(target, image), {**job_properties(target, image), "name": f"bench-direct-{number}"}))
    running: dict[int, float] = {}
    calls = {"submit": [], "job list": []}
    with _slurm_client() as submitter, _slurm_client() as watcher:
        _at_phase(phase)
        first = time.monotonic()
        ids: set[int] = set()
        stop = threading.Event()

        def watch() -> None:
            deadline = first + timeout
            while not stop.is_set() and time.monotonic() < deadline:
                asked = time.monotonic()
                listed = watcher.jobs()
                calls["job list"].append(time.monotonic() - asked)
                now = time.monotonic() - first
                for job in listed:
                    if job["job_id"] in ids and job.get("job_state") == "RUNNING":
                        running.setdefault(job["job_id"], now)
                if len(running) == count:
                    return
                time.sleep(0.05)

        watching = threading.Thread(target=watch)
        watching.start()
        for script, properties in jobs:
            asked = time.monotonic()
            ids.add(submitter.submit_job(script, properties)["job_id"])
            calls["submit"].append(time.monotonic() - asked)
        submitted = time.monotonic() - first
        watching.join()
        stop.set()
        for job_id in ids:
            submitter.cancel_job(job_id)
    _idle_slurm(runtime, timeout)
    return {**_latencies(count, list(running.values())), "started_s": [0.0, round(submitted, 2)], **_call_times(calls)}


def _direct_container(runtime: Runtime, count: int, timeout: float, phase: float | None = None) -> dict:
    """The same containers (image and options as the platform's driver gives `podman run`) started by one client
    one after another, each timed from the first `podman run` to its sshd answering, as the platform's readiness
    waits for; then removed."""
    from provisioning.drivers.container import ContainerWorkloads, Podman, _published_ports, _ssh_banner

    image = _image(runtime)
    driver = ContainerWorkloads()
    started: dict[str, tuple[Podman, str]] = {}
    podman_nodes: dict[str, str] = {}
    ready: dict[str, float] = {}
    calls = {"podman run": []}
    _at_phase(phase)
    first = time.monotonic()
    lock = threading.Lock()
    stop = threading.Event()

    def watch() -> None:
        ports: dict[str, int] = {}
        while not stop.is_set() and time.monotonic() < first + timeout and len(ready) < count:
            with lock:
                waiting = [(name, podman) for name, (podman, _) in started.items() if name not in ready]
            for name, podman in waiting:
                if name not in ports:
                    container = podman.inspect(name)
                    ports[name] = _published_ports(container)["ssh"] if container else 0
                if ports[name] and _ssh_banner(
                    settings.CONTAINER_ACCESS_HOST.format(node=podman_nodes[name]), ports[name]
                ):
                    ready[name] = time.monotonic() - first
            time.sleep(0.05)

    watching = threading.Thread(target=watch)
    watching.start()
    for number in range(count):
        target = _bench_target(runtime, number)
        podman = Podman.of(target.node)
        options = driver._run_options(target, image, leader_address="")  # one container, no gang to meet
        name = options[options.index("--name") + 1]
        asked = time.monotonic()
        podman.run("run", "--detach", *options)
        calls["podman run"].append(time.monotonic() - asked)
        with lock:
            podman_nodes[name] = target.node
            started[name] = (podman, name)
    all_started = time.monotonic() - first
    watching.join()
    stop.set()
    for podman, name in started.values():
        podman.run("rm", "--force", "--time", "0", name)
    return {
        **_latencies(count, list(ready.values())),
        "started_s": [0.0, round(all_started, 2)],
        **_call_times(calls),
    }


def _call_times(calls: dict[str, list[float]]) -> dict:
    return {
        "calls": {
            what: {"count": len(times), "p50_ms": round(1000 * statistics.median(times), 1)}
            for what, times in calls.items()
            if times
        }
    }


@contextlib.contextmanager
def _slurm_client() -> Iterator[SlurmApi]:
    with SlurmApi(url=settings.SLURM_REST_URL, user_name=settings.SLURM_USER_NAME, token=settings.SLURM_JWT) as api:
        yield api


def _idle_slurm(runtime: Runtime, timeout: float) -> None:
    """Until no job is pending, running or completing: the next measurement starts on an empty cluster."""
    deadline = time.monotonic() + timeout
    with _slurm_client() as api:
        while any(job.get("job_state") in LIVE_SLURM_STATES for job in api.jobs()):
            if time.monotonic() > deadline:
                raise CommandError(f"Slurm still runs jobs {timeout:g} s after the round.")
            time.sleep(0.2)


def _idle_container(runtime: Runtime, timeout: float) -> None:
    """Until none of the platform's containers is left on any node."""
    from provisioning.drivers.container import Podman

    deadline = time.monotonic() + timeout
    while any(Podman.of(node.name).containers() for node in runtime.nodes):
        if time.monotonic() > deadline:
            raise CommandError(f"Containers still run {timeout:g} s after the round.")
        time.sleep(0.2)


LIVE_SLURM_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING"})
DIRECT_IDS = 10_000_000  # the baselines' workloads are named after ids no request of the platform has
DIRECT: dict[str, Callable[[Runtime, int, float, float | None], dict]] = {
    ExecutionBackend.SLURM: _direct_slurm,
    ExecutionBackend.CONTAINER: _direct_container,
}
IDLE: dict[str, Callable[[Runtime, float], None]] = {
    ExecutionBackend.SLURM: _idle_slurm,
    ExecutionBackend.CONTAINER: _idle_container,
}


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


def _wait_until_quiet(runtime: Runtime, cpu_seconds: Callable[[], float], timeout: float) -> float:
    """Until the broker holds no task and neither the workers nor the backend's daemons use more than a trickle of
    CPU: what the previous measurement left behind is its own work, not the next one's. A platform round's release
    leaves tasks (a metering refresh, a readmission and a notification per request) that kept the next round's
    start tasks waiting for workers; after the baseline's hundred cancellations Slurm's daemons are still at work for
    a moment once its jobs are gone. Returns how long it waited."""
    broker = get_broker()
    started = time.monotonic()
    deadline = started + timeout
    used = (cpu_seconds(), _daemons_cpu_seconds(runtime))
    while time.monotonic() < deadline:
        time.sleep(QUIET_WINDOW_SECONDS)
        before, used = used, (cpu_seconds(), _daemons_cpu_seconds(runtime))
        busy = max(now - then for now, then in zip(used, before, strict=True))
        if broker.queue_size() == 0 and busy < QUIET_CPU_SECONDS:
            return round(time.monotonic() - started, 1)
    raise CommandError(f"The workers or the backend were still busy after {timeout:g} s.")


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


def _wait_until_settled(request_ids: list[int], timeout: float, states) -> None:
    deadline = time.monotonic() + timeout
    unsettled = ResourceRequest.objects.filter(pk__in=request_ids).exclude(state__in=states)
    while unsettled.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def _latencies(count: int, seconds: list[float]) -> dict:
    """wall_s (the last one), jobs_per_s, p50/p99 of `count` workloads' times to ready (those that got there)."""
    ordered = sorted(seconds)
    wall = ordered[-1] if ordered else None
    return {
        "requests": count,
        "active": len(ordered),
        "wall_s": round(wall, 2) if wall else None,
        "jobs_per_s": round(len(ordered) / wall, 1) if wall else 0.0,
        "p50_s": round(statistics.median(ordered), 2) if ordered else None,
        "p99_s": round(_percentile(ordered, 99), 2) if ordered else None,
    }


def _report(backend: str, requests: int, rounds: list[dict]) -> dict:
    """The median over the rounds of each figure, the baseline's beside the platform's, and every round."""

    def median(values):
        values = [value for value in values if value is not None]
        return round(statistics.median(values), 2) if values else None

    platform = [measured["platform"] for measured in rounds]
    direct = [measured["direct"] for measured in rounds]
    ratios = [
        p["jobs_per_s"] / d["jobs_per_s"] if d["jobs_per_s"] else None for p, d in zip(platform, direct, strict=True)
    ]
    for measured, ratio in zip(rounds, ratios, strict=True):
        measured["ratio"] = round(ratio, 3) if ratio is not None else None
    parts = {key for measured in platform for key, value in measured["breakdown"].items() if isinstance(value, float)}
    return {
        "backend": backend,
        "requests": requests,
        "rounds": len(rounds),
        "active": min(measured["active"] for measured in platform),
        **{key: median(measured[key] for measured in platform) for key in ("wall_s", "jobs_per_s", "p50_s", "p99_s")},
        "worker_cpu_s": median(measured["worker_cpu_s"] for measured in platform),
        **(
            {"backend_cpu_s": median(measured["backend_cpu_s"] for measured in platform)}
            if "backend_cpu_s" in platform[0]
            else {}
        ),
        "direct_jobs_per_s": median(measured["jobs_per_s"] for measured in direct),
        "direct_p50_s": median(measured["p50_s"] for measured in direct),
        "direct_active": min(measured["active"] for measured in direct),
        "started_s": {
            side: [median(measured["started_s"][edge] for measured in measurements) for edge in (0, 1)]
            for side, measurements in (("platform", platform), ("direct", direct))
        },
        "ratio": round(statistics.median(r for r in ratios if r is not None), 3) if any(ratios) else None,
        "breakdown": {
            **{part: median(measured["breakdown"].get(part) for measured in platform) for part in sorted(parts)},
            "direct calls": direct[-1]["calls"],
            "reconciler": platform[0]["breakdown"]["reconciler"],
        },
        "load_avg": [[round(value, 1) for value in measured["load_avg"]] for measured in rounds],
        "per_round": rounds,
    }


def _percentile(ordered: list[float], q: int) -> float:
    """Nearest-rank percentile of an ascending list."""
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
