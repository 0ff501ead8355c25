"""Gateway overhead under load on loopback: the same non-streaming chat request from N concurrent clients, first
straight to an inference server, then through the gateway (gunicorn, this project, the same database), and the
latency the gateway adds at the median and the 99th percentile.

The benchmark's deployment is written straight into the database (a served request, its replica and a key):
what is measured is the gateway, not the ordering workflow.
"""

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from config.env import database_url

BODY = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "Summarise the quarterly GPU usage."}],
    "max_tokens": 32,
}
GATEWAY_WORKERS, GATEWAY_THREADS = 2, 32
WARM_UP_SECONDS = 3.0


class Command(BaseCommand):
    help = "Measure the gateway's added latency and throughput against the inference server alone."

    def add_arguments(self, parser):
        parser.add_argument("--clients", type=int, default=50)
        parser.add_argument("--seconds", type=float, default=20.0)
        parser.add_argument(
            "--rate",
            type=float,
            default=0.0,
            help="Total requests per second, paced across the clients (open loop); 0 = each client "
            "sends its next request as soon as the previous answer arrives (closed loop).",
        )
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, clients: int, seconds: float, rate: float, as_json: bool, **options):
        with _process(_inference_command(port := _free_port())) as _server:
            _wait_until_up(f"http://127.0.0.1:{port}/health")
            slug, secret = _deployment(f"http://127.0.0.1:{port}")
            direct = _measured(f"http://127.0.0.1:{port}/v1/chat/completions", {}, clients, seconds, rate)
            with _process(_gateway_command(gateway_port := _free_port()), env=_gateway_env()):
                _wait_until_up(f"http://127.0.0.1:{gateway_port}/healthz")
                url = f"http://127.0.0.1:{gateway_port}/serve/{slug}/v1/chat/completions"
                through = _measured(url, {"Authorization": f"Bearer {secret}"}, clients, seconds, rate)
        report = {**_report(clients, direct, through), "offered_rps": rate or None}
        self.stdout.write(json.dumps(report) if as_json else "\n".join(f"{k}: {v}" for k, v in report.items()))


@dataclass(frozen=True)
class LoadRun:
    latencies: list[float]
    seconds: float

    @property
    def rps(self) -> float:
        return round(len(self.latencies) / self.seconds, 1)

    def percentile_ms(self, q: int) -> float:
        return round(statistics.quantiles(self.latencies, n=100)[q - 1] * 1000, 2)


def _report(clients: int, direct: LoadRun, through: LoadRun) -> dict:
    return {
        "clients": clients,
        "rps": through.rps,
        "direct_p50_ms": direct.percentile_ms(50),
        "direct_p99_ms": direct.percentile_ms(99),
        "gateway_p50_ms": through.percentile_ms(50),
        "gateway_p99_ms": through.percentile_ms(99),
        "overhead_p50_ms": round(through.percentile_ms(50) - direct.percentile_ms(50), 2),
        "overhead_p99_ms": round(through.percentile_ms(99) - direct.percentile_ms(99), 2),
        "direct_rps": direct.rps,
    }


def _measured(url: str, headers: dict, clients: int, seconds: float, rate: float) -> LoadRun:
    """A warm-up first (every worker thread opens its database connection, caches fill), then the measurement."""
    asyncio.run(_load(url, headers, clients, WARM_UP_SECONDS, rate))
    return asyncio.run(_load(url, headers, clients, seconds, rate))


async def _load(url: str, headers: dict, clients: int, seconds: float, rate: float) -> LoadRun:
    """`clients` keep-alive connections sending for `seconds`, back to back or paced to `rate` in all: every
    latency, and how long it took. A minimal HTTP/1.1 client, so the load generator costs little of the CPU the
    servers share."""
    parts = urlsplit(url)
    payload = json.dumps(BODY).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    interval = clients / rate if rate else 0.0

    async def one_client(offset: float):
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        next_send = time.monotonic() + offset
        try:
            while next_send < deadline:
                await asyncio.sleep(max(0.0, next_send - time.monotonic()))
                started = time.perf_counter()
                writer.write(request)
                await _read_response(reader)
                latencies.append(time.perf_counter() - started)
                next_send = max(next_send + interval, time.monotonic()) if interval else time.monotonic()
        finally:
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(one_client(interval * n / clients) for n in range(clients)))
    return LoadRun(latencies, time.monotonic() - started)


async def _read_response(reader: asyncio.StreamReader) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status = head.split(" ", 2)[1]
    if status != "200":
        raise RuntimeError(f"HTTP {status}: {head.splitlines()[0]}")
    length = next(
        int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.lower().startswith("content-length:")
    )
    await reader.readexactly(length)


def _deployment(replica_url: str) -> tuple[str, str]:
    """A served request with one healthy replica and a key, written straight into the database."""
    from catalog.choices import ServiceKind
    from catalog.models import Service
    from provisioning.models import ServingDeployment, ServingReplica
    from provisioning.serving.keys import api_key_create
    from requests.choices import RequestState
    from requests.models import ResourceRequest
    from requests.models.request import snapshot_hash
    from tenancy.choices import Role
    from tenancy.models import Project, Tenant, User
    from tenancy.services import membership_grant

    stamp = int(time.time())
    user = User.objects.create_user(f"bench-{stamp}", password=None)
    tenant = Tenant.objects.create(name=f"Bench {stamp}", slug=f"bench-{stamp}")
    lead = User.objects.create_user(f"bench-lead-{stamp}", password=None)
    project = Project.objects.create(tenant=tenant, name=f"Bench {stamp}", slug=f"bench-{stamp}", lead=lead)
    membership_grant(project=project, user=user, role=Role.MEMBER, actor=None)
    service = Service.objects.create(
        name=f"Bench serving {stamp}",
        slug=f"bench-serving-{stamp}",
        kind=ServiceKind.MODEL_SERVING,
        default_duration_hours=1,
        max_duration_hours=1,
    )
    snapshot = {"service": {"kind": ServiceKind.MODEL_SERVING}}
    request = ResourceRequest.objects.create(
        tenant=tenant,
        project=project,
        requester=user,
        service=service,
        duration_hours=1,
        state=RequestState.ACTIVE,
        gpu_equivalents=1,
        accelerator_count=1,
        accelerator_memory_gb=80,
        cpu_cores=4,
        memory_gb=32,
        card_hours=1,
        hourly_cost=0,
        cost_estimate=0,
        approved_spec=snapshot,
        approved_spec_hash=snapshot_hash(snapshot),
        approved_at=timezone.now(),
    )
    deployment = ServingDeployment.objects.create(
        request=request,
        project=project,
        slug=f"bench-{stamp}",
        model_name=BODY["model"],
        state=ServingDeployment.State.SERVING,
        rate_limit_per_minute=10_000_000,
    )
    ServingReplica.objects.create(
        deployment=deployment,
        name="replica-0",
        url=replica_url,
        healthy=True,
        checked_at=timezone.now() - timedelta(seconds=1),
    )
    return deployment.slug, api_key_create(project=project, name="bench", actor=user).secret


def _inference_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "provisioning.serving.inference_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        BODY["model"],
        "--replica",
        "replica-0",
    ]


def _gateway_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "config.wsgi",
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        str(GATEWAY_WORKERS),
        "--threads",
        str(GATEWAY_THREADS),
        "--log-level",
        "warning",
    ]


def _gateway_env() -> dict:
    """The gateway processes use this process's database (a test run's test database included)."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(settings.DATABASES["default"]),
        "DEBUG": "0",
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only"),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }


@contextmanager
def _process(command: list[str], env: dict | None = None):
    process = subprocess.Popen(
        command, cwd=settings.BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=15)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_up(url: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up within {seconds:g} s")
