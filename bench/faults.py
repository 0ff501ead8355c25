"""`python -m bench.faults [--json] [--orders 50] [--releases 10] [--outage 60] [--restart 4] [--scenario NAME ...]`

The platform through the faults an operator meets, at a scale the test suite does not run (tests/provisioning/
test_slurm_faults.py runs the same scenarios small): a real Slurm cluster (devcluster/slurm_cluster.py, 8 nodes of 8
GPUs), a real `qcluster` (Redis broker, BENCH_REDIS_URL) with the product's default settings and its minute
schedules, PostgreSQL (a scratch database, BENCH_FAULTS_DATABASE, made afresh). Per scenario: `releases` one-GPU
orders are made active first; then the fault begins, the releases are asked for and `orders` new orders are
submitted while it lasts; then the backend comes back and the bench waits for everything to settle.

Scenarios: `controller_outage` (slurmctld stopped for --outage seconds), `controller_restart` (slurmctld stopped
for --restart seconds while the orders are in flight), `rest_outage` (slurmrestd stopped for --outage seconds),
`drain` (a node drained with scontrol for --outage seconds while orders are placed, then resumed),
`database_drop` (every PostgreSQL session of the platform terminated three times over 30 s while the orders and
releases are in flight). The restart and the drops start once provisioning is under way.

Reported per scenario (one JSON object each with --json):
- orders, releases: submitted during the fault, released during the fault;
- failed: orders that ended `failed`, and releases whose run failed;
- stuck: orders not active and releases not released `--settle` seconds after the fault ended;
- lost: work and books that disagree at the end: an active order without its Slurm job, or a job of ours running
  on a card the books call free;
- doubled: orders with more than one Slurm job;
- cordoned: nodes cordoned at the end (after convergence, or after --settle);
- waiting_shown: orders and releases whose API answer (`GET /api/v1/requests/{id}/`, polled as a developer's page
  does, ten a round every 2 s, taking turns) named why they waited while the fault lasted;
- api_5xx: answers of 500 or more to those polls;
- converge_s: seconds from the end of the fault (the daemon answering again, the node resumed, the last drop) to
  the last order active and the last release released;
- uncordoned_s: seconds from the end of the fault until no node is cordoned (a node Slurm drains is cordoned while
  it is drained, and uncordoned when the platform next reads Slurm's node states after its resume).
"""

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psycopg

from bench.headline import Headline

ROOT = Path(__file__).resolve().parents[1]
SERVER_URL = os.environ.get("BENCH_DATABASE_SERVER", "postgres://postgres@127.0.0.1:5432")
DATABASE = os.environ.get("BENCH_FAULTS_DATABASE", "compute_catalog_faults_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
NODES, GPUS_PER_NODE = 8, 8
WORKERS = 4
POLL_SECONDS = 2.0
SAMPLE = 10  # requests a developer's poll reads per round
SCENARIOS = ["controller_outage", "controller_restart", "rest_outage", "drain", "database_drop"]
TITLE = "Faults: orders and releases through Slurm and database outages"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
TARGET = "0 lost, doubled, failed, stuck or cordoned, and no 5xx, in every scenario; the wait shown while it lasts"
FAULT_COUNTS = ("lost", "doubled", "failed", "stuck", "cordoned", "api_5xx")


@dataclass
class Options:
    orders: int = 50
    releases: int = 10
    outage: float = 60.0
    restart: float = 4.0
    settle: float = 300.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", dest="as_json", help="One JSON object per scenario.")
    parser.add_argument("--orders", type=int, default=Options.orders)
    parser.add_argument("--releases", type=int, default=Options.releases)
    parser.add_argument("--outage", type=float, default=Options.outage, help="Seconds an outage or drain lasts.")
    parser.add_argument("--restart", type=float, default=Options.restart, help="Seconds slurmctld is down.")
    parser.add_argument("--settle", type=float, default=Options.settle, help="Seconds to wait for convergence.")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="Run only these (repeatable).")
    arguments = parser.parse_args(argv)
    _prepare_django()
    options = Options(arguments.orders, arguments.releases, arguments.outage, arguments.restart, arguments.settle)
    for row in _run_scenarios(options, arguments.scenario or SCENARIOS):
        print(json.dumps(row) if arguments.as_json else "  ".join(f"{key}={value}" for key, value in row.items()))
    return 0


def _prepare_django() -> None:
    """A fresh scratch database, Django pointed at it and migrated."""
    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
    from bench import ORDER_CAP_SETTINGS

    os.environ.update(
        DATABASE_URL=f"{SERVER_URL}/{DATABASE}",
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only"),
        METRICS_TOKEN="bench-only",
        SECURE_SSL_REDIRECT="0",  # the in-process test client speaks plain HTTP
        **dict.fromkeys(ORDER_CAP_SETTINGS, "0"),  # 60 orders at once from one developer are the point here
        DEBUG="0",
        ALLOWED_HOSTS="testserver",
        DJANGO_SETTINGS_MODULE="config.settings",
        LOG_LEVEL="WARNING",
        REDIS_URL=REDIS_URL,  # the broker this process enqueues into and the workers read
    )
    import django

    warnings.filterwarnings("ignore", message="No directory at")  # WhiteNoise: no collectstatic for benchmarks
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def headline(rows: list[dict]) -> Headline:
    faults = sum(row[count] for row in rows for count in FAULT_COUNTS)
    unsettled = [row["scenario"] for row in rows if row["converge_s"] is None]
    settled = [row for row in rows if row["converge_s"] is not None]
    slowest = max(settled, key=lambda row: row["converge_s"]) if settled else None
    converged = f"slowest to converge {slowest['scenario']} {slowest['converge_s']} s" if slowest else "none converged"
    not_converged = f"; not converged: {', '.join(unsettled)}" if unsettled else ""
    return Headline(
        f"{faults} lost/doubled/failed/stuck/cordoned/5xx over {len(rows)} scenarios; {converged}{not_converged}"
    )


def run() -> list[dict]:
    """For `make bench` (bench/run.py): every scenario at the default scale, in a process of its own (its own
    scratch database, and the Redis broker its workers read, which must be known when Django starts)."""
    import subprocess

    answer = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--json"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [json.loads(line) for line in answer.stdout.splitlines() if line.startswith("{")]


def _run_scenarios(options: Options, scenarios: list[str]) -> list[dict]:
    """Each scenario on one cluster and one worker pool (Django set up on the scratch database)."""
    from django.test.utils import override_settings

    from devcluster.slurm_cluster import NodeShape, running_cluster

    shape = NodeShape(cpus=2 * GPUS_PER_NODE, real_memory_mib=2048 * GPUS_PER_NODE, gpus=GPUS_PER_NODE)
    with running_cluster(node_count=NODES, node_shape=shape, name_prefix="faults") as cluster:
        platform = _Platform(cluster)
        with override_settings(**platform.settings), platform.workers():
            return [platform.scenario(name, options) for name in scenarios]


class _Platform:
    """The cluster in the inventory, a one-GPU service, a developer, the workers; and each scenario's run."""

    def __init__(self, cluster):
        from bench.execution_runtimes import slurm_settings, tune_scheduler

        self.cluster = cluster
        tune_scheduler(cluster)
        self.settings = slurm_settings(cluster)
        self.order, self.developer = _catalog(cluster)

    @contextlib.contextmanager
    def workers(self) -> Iterator[None]:
        """A real qcluster on the Redis broker; this process only enqueues. The minute schedules run as in
        production (the sweeper and the reconciler are part of how the platform recovers)."""
        from django_q.conf import Conf

        from bench.execution import _workers

        with _workers(WORKERS, {**self.settings, "REDIS_URL": REDIS_URL}):
            _schedules_due_now()
            sync, Conf.SYNC = Conf.SYNC, False
            try:
                yield
            finally:
                Conf.SYNC = sync

    def scenario(self, name: str, options: Options) -> dict:
        from requests.choices import RequestState

        print(f"scenario {name} ...", file=sys.stderr, flush=True)
        releases = [self._submit() for _ in range(options.releases)]
        _settle(releases, RequestState.ACTIVE, options.settle)
        fault = _FAULTS[name](self.cluster, options)
        poller = _Poller()
        with fault as ended:
            for request in releases:
                self._release(request)
            orders = []
            for _ in range(options.orders):
                orders.append(self._submit())
                poller.poll(orders + releases)
            poller.poll_until(orders + releases, ended.deadline)
        returned = time.monotonic()
        remaining = lambda: options.settle - (time.monotonic() - returned)  # noqa: E731
        settled = _settle(orders, RequestState.ACTIVE, options.settle) and _settle(
            releases, RequestState.RELEASED, remaining()
        )
        converge = round(time.monotonic() - returned, 1) if settled else None
        uncordoned = round(time.monotonic() - returned, 1) if _uncordoned(remaining()) else None
        row = {
            "scenario": name,
            **_accounts(self.cluster, orders, releases),
            **poller.counts(),
            "converge_s": converge,
            "uncordoned_s": uncordoned,
        }
        self._release_all(orders, options.settle)
        return row

    def _submit(self):
        from requests import services

        return services.request_submit(order=self.order, requester=self.developer)

    def _release(self, request):
        from requests import services
        from requests.models import ResourceRequest

        request = ResourceRequest.objects.get(pk=request.pk)
        return services.request_release(request=request, actor=self.developer, reason="bench: done")

    def _release_all(self, requests, seconds: float) -> None:
        """What the scenario left running goes, before the next one starts (not measured)."""
        from requests.choices import RequestState
        from requests.models import ResourceRequest

        for request in ResourceRequest.objects.filter(pk__in=[r.pk for r in requests], state=RequestState.ACTIVE):
            self._release(request)
        _settle(requests, RequestState.RELEASED, seconds, accept=(RequestState.FAILED,))
        self.cluster.cancel_all_jobs()
        self.cluster.resume_all()


# --- Faults --------------------------------------------------------------------------------------------------------


@dataclass
class _Window:
    """Until when the bench keeps polling as a developer would (the fault's planned end)."""

    deadline: float


@contextlib.contextmanager
def _daemon_down(cluster, name: str, seconds: float) -> Iterator[_Window]:
    cluster.stop_daemon(name)
    window = _Window(time.monotonic() + seconds)
    try:
        yield window
        _sleep_until(window.deadline)
    finally:
        cluster.start_daemon(name)


@contextlib.contextmanager
def _restart_in_flight(cluster, seconds: float) -> Iterator[_Window]:
    """slurmctld stopped for a few seconds as soon as the orders' provisioning is under way (while they are still
    being submitted), then started again."""

    def restart():
        _until_steps_run()
        cluster.stop_daemon("slurmctld")
        _sleep_until(time.monotonic() + seconds)
        cluster.start_daemon("slurmctld")

    with _alongside(restart) as done:
        yield _Window(time.monotonic())
    done()


@contextlib.contextmanager
def _drained(cluster, seconds: float) -> Iterator[_Window]:
    node = cluster.node_names[0]
    cluster.scontrol("update", f"nodename={node}", "state=drain", "reason=bench: maintenance")
    window = _Window(time.monotonic() + seconds)
    try:
        yield window
        _sleep_until(window.deadline)
    finally:
        cluster.scontrol("update", f"nodename={node}", "state=resume")


@contextlib.contextmanager
def _database_drops(cluster, seconds: float, drops: int = 3) -> Iterator[_Window]:
    """Every session of the platform's database but the bench's own terminated `drops` times, the first as soon as
    provisioning is under way, then spread over `seconds`, while the orders and releases go on."""
    from django.db import connection

    with connection.cursor() as cursor:  # the bench's own session, which submits and polls as the web would
        cursor.execute("SELECT pg_backend_pid()")
        (spared,) = cursor.fetchone()

    def drop():
        _until_steps_run()
        for _ in range(drops):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> %s",
                    [spared],
                )
            _sleep_until(time.monotonic() + seconds / drops)

    with _alongside(drop) as done:
        yield _Window(time.monotonic() + seconds)
    done()


@contextlib.contextmanager
def _alongside(fault: Callable[[], None]) -> Iterator[Callable[[], None]]:
    """The fault in a thread of its own (with its own database connection) while the scenario submits and polls;
    the context gives a function that waits for it to end."""
    import threading

    from django.db import connection

    def in_thread():
        try:
            fault()
        finally:
            connection.close()

    thread = threading.Thread(target=in_thread, name="bench-fault")
    thread.start()
    try:
        yield thread.join
    finally:
        thread.join()


def _until_steps_run(seconds: float = 60.0) -> None:
    """Until a provisioning step is running (work is in flight), at most `seconds`."""
    from provisioning.choices import StepState
    from provisioning.models import ProvisioningStep

    deadline = time.monotonic() + seconds
    while not ProvisioningStep.objects.filter(state=StepState.RUNNING).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


_FAULTS: dict[str, Callable] = {
    "controller_outage": lambda cluster, options: _daemon_down(cluster, "slurmctld", options.outage),
    "controller_restart": lambda cluster, options: _restart_in_flight(cluster, options.restart),
    "rest_outage": lambda cluster, options: _daemon_down(cluster, "slurmrestd", options.outage),
    "drain": lambda cluster, options: _drained(cluster, options.outage),
    "database_drop": lambda cluster, options: _database_drops(cluster, min(options.outage, 30.0)),
}


# --- What a developer sees, and the accounts -----------------------------------------------------------------------


class _Poller:
    """The request API as a developer's page polls it: 5xx answers, and whether it said why the request waits."""

    def __init__(self):
        from django.test import Client

        self.client = Client(raise_request_exception=False)
        self.logged_in: set[int] = set()
        self.server_errors = 0
        self.shown: set[int] = set()
        self.last, self.turn = 0.0, 0

    def poll(self, requests) -> None:
        """At most SAMPLE of them per round, taking turns, so polling costs the same at any scale."""
        if time.monotonic() - self.last < POLL_SECONDS:
            return
        self.last = time.monotonic()
        start = self.turn % max(len(requests), 1)
        self.turn += SAMPLE
        for request in (requests[start:] + requests[:start])[:SAMPLE]:
            if request.requester_id not in self.logged_in:
                self.client.force_login(request.requester)
                self.logged_in.add(request.requester_id)
            answer = self.client.get(f"/api/v1/requests/{request.pk}/")
            if answer.status_code >= 500:
                self.server_errors += 1
                continue
            if _says_why_it_waits(answer.json()):
                self.shown.add(request.pk)

    def poll_until(self, requests, deadline: float) -> None:
        while time.monotonic() < deadline:
            self.poll(requests)
            time.sleep(0.2)

    def counts(self) -> dict:
        return {"waiting_shown": len(self.shown), "api_5xx": self.server_errors}


def _says_why_it_waits(body: dict) -> bool:
    """The outage it waits out, the queue's backend_unavailable, or the backend's own reason for holding its job
    (a drained node: Slurm's ReqNodeNotAvail on the timeline)."""
    backend_holds = any(
        event["code"] == "queue_reason" and "backend" in (event["data"].get("details") or {})
        for event in body.get("timeline") or []
    )
    queued = (body.get("queue") or {}).get("code") == "backend_unavailable"
    return bool((body.get("provisioning") or {}).get("waiting")) or queued or backend_holds


def _accounts(cluster, orders, releases) -> dict:
    from provisioning.choices import RunKind, RunState
    from provisioning.drivers.slurm import JOB_COMMENT, RUNNING, gpu_indexes
    from provisioning.models import ProvisioningRun
    from requests.choices import RequestState
    from requests.models import ResourceRequest
    from scheduling.choices import AllocationState
    from scheduling.models import Allocation, Device, Node
    from scheduling.slurm.api import SlurmApi

    states = dict(ResourceRequest.objects.filter(pk__in=[r.pk for r in orders + releases]).values_list("pk", "state"))
    with SlurmApi(url=cluster.rest_url, user_name=cluster.user_name, token=cluster.token, timeout=30) as api:
        jobs = api.jobs()
    ours = [(job, JOB_COMMENT.match(job.get("comment") or "")) for job in jobs]
    ours = [(job, int(named["request"]), int(named["allocation"])) for job, named in ours if named]
    live = {request_id for job, request_id, _ in ours if job["job_state"] == RUNNING}
    on_free_cards = 0
    for job, _request_id, allocation_id in ours:
        if job["job_state"] != RUNNING:
            continue
        held = Allocation.objects.filter(pk=allocation_id, state=AllocationState.ACTIVE).exists()
        cards = Device.objects.filter(node__name=job["nodes"], index__in=gpu_indexes(job["gres_detail"]))
        on_free_cards += not held or any(card.allocated_milli == 0 for card in cards)
    per_request = {}
    for _job, request_id, _allocation in ours:
        per_request[request_id] = per_request.get(request_id, 0) + 1
    failed_releases = ProvisioningRun.objects.filter(
        request__in=[r.pk for r in releases], kind=RunKind.RELEASE, state=RunState.FAILED
    ).count()
    return {
        "orders": len(orders),
        "releases": len(releases),
        "lost": on_free_cards + sum(1 for r in orders if states[r.pk] == RequestState.ACTIVE and r.pk not in live),
        "doubled": sum(1 for r in orders if per_request.get(r.pk, 0) > 1),
        "failed": sum(1 for r in orders if states[r.pk] == RequestState.FAILED) + failed_releases,
        "stuck": sum(1 for r in orders if states[r.pk] not in (RequestState.ACTIVE, RequestState.FAILED))
        + sum(1 for r in releases if states[r.pk] != RequestState.RELEASED),
        "cordoned": Node.objects.filter(schedulable=False).count(),
    }


# --- Setup and waiting ---------------------------------------------------------------------------------------------


def _catalog(cluster):
    """The cluster's nodes in the inventory (8 x a100 each), a one-GPU service open to everyone, and a developer of a
    project with room for every order at once."""
    from bench.shop import bench_service
    from catalog.choices import AcceleratorKind, Interconnect
    from catalog.models import AcceleratorModel, ResourceSpec, Vendor
    from requests.orders import Order
    from scheduling.choices import ExecutionBackend
    from scheduling.models import Device, Node
    from tenancy.models import User
    from tenancy.services import project_create, tenant_create

    gpu_type = cluster.node_shape.gpu_type
    accelerator = AcceleratorModel.objects.create(
        slug=gpu_type,
        vendor=Vendor.objects.get(slug="nvidia"),
        name=f"{gpu_type.upper()} (faults bench)",
        kind=AcceleratorKind.GPU,
        memory_gb=80,
        interconnect=Interconnect.PCIE,
    )
    for name in cluster.node_names:
        node = Node.objects.create(
            name=name,
            serial_number=f"faults-{name}",
            execution_backend=ExecutionBackend.SLURM,
            cpu_milli=cluster.node_shape.cpus * 1000,
            memory_mib=cluster.node_shape.real_memory_mib,
        )
        Device.objects.bulk_create(
            Device(node=node, index=index, uuid=f"GPU-{name}-{index}", model=accelerator, memory_gb=80)
            for index in range(cluster.node_shape.gpus)
        )
    developer = User.objects.create_user("faults-developer", password=None)
    tenant = tenant_create(name="Faults bench", slug="faults-bench", actor=None)
    capacity = NODES * GPUS_PER_NODE
    project = project_create(
        tenant=tenant,
        name="Faults bench",
        slug="faults-bench",
        lead=developer,
        cost_centre="BENCH",
        quota={
            "gpus": Decimal(capacity),
            "accelerator_memory_gb": capacity * 80,
            "cpu_cores": capacity,
            "memory_gb": capacity,
            "concurrent_tasks": capacity,
            "monthly_card_hours": Decimal(10**6),
        },
        actor=None,
    )
    spec = ResourceSpec.objects.create(
        name="1x GPU (faults bench)",
        slug="faults-1x",
        accelerator_count=1,
        cpu_cores=1,
        memory_gb=1,
        hourly_price=Decimal("1.00"),
        max_duration_hours=24,
    )
    spec.accelerator_models.set([accelerator])
    service, image = bench_service(
        name="Faults bench", slug="faults-bench", specs=[spec], accelerator=accelerator, max_duration_hours=24
    )
    return Order(service=service, project=project, duration_hours=1, spec=spec, image=image), developer


def _schedules_due_now() -> None:
    """The workers' start deferred the minute schedules (bench_execution's housekeeping): the ones that keep
    provisioning and placement going run here as in production, since the sweeper, the reconciler, the cycle and the
    Slurm import are part of how the platform recovers from a fault (metering and mail stay deferred)."""
    from django.utils import timezone
    from django_q.models import Schedule

    from provisioning import wiring as provisioning_wiring
    from scheduling import wiring as scheduling_wiring

    recovery = [
        provisioning_wiring.SWEEP_TASK,
        provisioning_wiring.STRANDED_TASK,
        provisioning_wiring.RECONCILE_TASK,
        scheduling_wiring.CYCLE_TASK,
        scheduling_wiring.RECLAIM_TASK,
        scheduling_wiring.SLURM_IMPORT_TASK,
    ]
    Schedule.objects.filter(func__in=recovery).update(next_run=timezone.now())


def _settle(requests, state: str, seconds: float, accept: tuple = ()) -> bool:
    """Wait until every request is in `state` (or one of `accept`); False when `seconds` pass first."""
    from requests.models import ResourceRequest

    deadline = time.monotonic() + max(seconds, 0)
    pending = ResourceRequest.objects.filter(pk__in=[r.pk for r in requests]).exclude(state__in=[state, *accept])
    while pending.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _uncordoned(seconds: float) -> bool:
    """Until no node is cordoned (a node Slurm drained is cordoned while it is, and uncordoned once Slurm resumes it);
    False when `seconds` pass first."""
    from scheduling.models import Node

    deadline = time.monotonic() + max(seconds, 0)
    while Node.objects.filter(schedulable=False).exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


if __name__ == "__main__":
    sys.exit(main())
