"""Gateway overhead under load on loopback: the same non-streaming chat request from N concurrent clients, straight
to an inference server, through haproxy in front of it (the ceiling: a proxy that does nothing but proxy), and
through the gateway (`manage.py run_gateway`, on this database and Redis, with the key check, a rate limit, a token
budget and metering all on); closed loop for throughput, then paced for the latency the gateway adds below
saturation.

The benchmark's deployment is written straight into the database (a served request, its replica and a key):
what is measured is the gateway, not the ordering workflow.
"""

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from config.env import database_url
from config.probes import wait_until_answers

BODY = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "Summarise the quarterly GPU usage."}],
    "max_tokens": 32,
}
WARM_UP_SECONDS = 3.0
# A gateway waits up to GATEWAY_SHUTDOWN_SECONDS for calls in flight and again for their token counts, then flushes;
# on a loaded machine that has taken longer than 15 s.
STOP_SECONDS = 60.0
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
HAPROXY_CONFIG = """global
    maxconn 4096
    nbthread 1
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
frontend bench
    bind 127.0.0.1:{port}
    default_backend replica
backend replica
    http-reuse always
    server replica-0 127.0.0.1:{upstream} maxconn 1000
"""


class Command(BaseCommand):
    help = "Measure the gateway's added latency and throughput against the inference server alone."

    def add_arguments(self, parser):
        parser.add_argument("--clients", type=int, default=50)
        parser.add_argument("--seconds", type=float, default=20.0)
        parser.add_argument(
            "--rate",
            type=float,
            default=500.0,
            help="The paced runs' total requests per second across the clients (open loop); 0 = no paced run.",
        )
        parser.add_argument("--gateways", type=int, default=1, help="Gateway processes sharing the port.")
        parser.add_argument("--no-haproxy", action="store_true", dest="no_haproxy")
        parser.add_argument(
            "--engine",
            action="store_true",
            help="Also measure the llama.cpp engine (SmolLM2, `make llama`): tokens/s straight and through a gateway.",
        )
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, clients, seconds, rate, gateways, no_haproxy, engine, as_json, **options):
        import redis

        redis.from_url(REDIS_URL).flushdb()
        report = {"clients": clients, "gateways": gateways, "load_average": list(os.getloadavg())}
        with _process(_inference_command(port := _free_port())) as upstream:
            wait_until_answers(f"http://127.0.0.1:{port}/health")
            slug, secret = _deployment(f"http://127.0.0.1:{port}")
            direct_url = f"http://127.0.0.1:{port}/v1/chat/completions"
            direct = _measured(direct_url, {}, clients, seconds, 0, {"upstream": [upstream.pid]})
            report.update(
                direct_cpu_us_per_request=direct.cpu_us_per_request,
                direct_cpu_wait_us_per_request=direct.cpu_wait_us_per_request,
            )
            if not no_haproxy:
                with _haproxy(port) as haproxy:
                    proxied = _measured(
                        haproxy.url, {}, clients, seconds, 0, {"haproxy": [haproxy.pid], "upstream": [upstream.pid]}
                    )
                report.update(
                    haproxy_rps=proxied.rps,
                    haproxy_ratio=round(proxied.rps / direct.rps, 3),
                    haproxy_cpu_us_per_request=proxied.cpu_us_per_request,
                )
            gateway_port = _free_port()
            commands = [_gateway_command(gateway_port, reuse_port=gateways > 1) for _ in range(gateways)]
            with contextlib.ExitStack() as stack:
                started = [stack.enter_context(_process(command, env=_gateway_env())) for command in commands]
                wait_until_answers(f"http://127.0.0.1:{gateway_port}/healthz")
                url = f"http://127.0.0.1:{gateway_port}/serve/{slug}/v1/chat/completions"
                headers = {"Authorization": f"Bearer {secret}"}
                servers = {"gateway": [p.pid for p in started], "upstream": [upstream.pid]}
                through = _measured(url, headers, clients, seconds, 0, servers)
                report.update(_report(direct, through))
                if rate:
                    paced_direct = _measured(direct_url, {}, clients, seconds, rate, {"upstream": [upstream.pid]})
                    paced = _measured(url, headers, clients, seconds, rate, servers)
                    report.update(
                        paced_rps=paced.rps,
                        paced_direct_p99_ms=paced_direct.percentile_ms(99),
                        paced_gateway_p99_ms=paced.percentile_ms(99),
                        paced_overhead_p50_ms=round(paced.percentile_ms(50) - paced_direct.percentile_ms(50), 2),
                        paced_overhead_p99_ms=round(paced.percentile_ms(99) - paced_direct.percentile_ms(99), 2),
                        paced_cpu_us_per_request=paced.cpu_us_per_request,
                        paced_cpu_wait_us_per_request=paced.cpu_wait_us_per_request,
                    )
                if engine:
                    report.update(_engine(gateway_port, seconds))
            report["metered_requests"] = _metered(slug)
        self.stdout.write(json.dumps(report) if as_json else "\n".join(f"{k}: {v}" for k, v in report.items()))


ENGINE_CLIENTS, ENGINE_MAX_TOKENS = 2, 64


def _engine(gateway_port: int, seconds: float) -> dict:
    """SmolLM2 on llama.cpp's server (2 threads): completion tokens per second from 2 clients, straight and through
    the gateway (non-streaming, temperature 0, 64 tokens an answer)."""
    from catalog.serving_models import SMOLLM2
    from provisioning.drivers.llamacpp import model_path, server_command

    port = _free_port()
    serving = {"model_name": BODY["model"], "context_length": 2048}
    command = server_command(
        python=settings.LLAMACPP_PYTHON,
        model=model_path(SMOLLM2["artifact_uri"]),
        port=port,
        threads=2,
        serving=serving,
    )
    with _process(command):
        wait_until_answers(f"http://127.0.0.1:{port}/v1/models", seconds=120)
        slug, secret = _deployment(f"http://127.0.0.1:{port}")
        time.sleep(1.0)  # the gateways pick the new route up
        direct = _tokens_per_second(f"http://127.0.0.1:{port}/v1/chat/completions", {}, seconds)
        through = _tokens_per_second(
            f"http://127.0.0.1:{gateway_port}/serve/{slug}/v1/chat/completions",
            {"Authorization": f"Bearer {secret}"},
            seconds,
        )
    return {
        "engine_tokens_per_s_direct": direct,
        "engine_tokens_per_s_gateway": through,
        "engine_ratio": round(through / direct, 3) if direct else None,
    }


def _tokens_per_second(url: str, headers: dict, seconds: float) -> float:
    body = {**BODY, "max_tokens": ENGINE_MAX_TOKENS, "temperature": 0}
    httpx.post(url, json=body, headers=headers, timeout=120).raise_for_status()  # warm-up: the first call loads pages
    tokens, deadline = 0, time.monotonic() + seconds

    async def client():
        nonlocal tokens
        async with httpx.AsyncClient(timeout=120, headers=headers) as http:
            while time.monotonic() < deadline:
                answer = await http.post(url, json=body)
                answer.raise_for_status()
                tokens += answer.json()["usage"]["completion_tokens"]

    async def all_clients():
        await asyncio.gather(*(client() for _ in range(ENGINE_CLIENTS)))

    started = time.monotonic()
    asyncio.run(all_clients())
    return round(tokens / (time.monotonic() - started), 1)


def _metered(slug: str) -> int:
    from metering.models import TokenUsage
    from serving.models import ServingDeployment

    deployment = ServingDeployment.objects.get(slug=slug)
    return sum(TokenUsage.objects.filter(request_id=deployment.request_id).values_list("requests", flat=True))


@dataclass(frozen=True)
class Haproxy:
    pid: int
    url: str


@contextmanager
def _haproxy(upstream: int):
    port = _free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as config:
        config.write(HAPROXY_CONFIG.format(port=port, upstream=upstream))
    try:
        with _process([shutil.which("haproxy") or "/usr/sbin/haproxy", "-f", config.name, "-db"]) as process:
            wait_until_answers(f"http://127.0.0.1:{port}/health")
            yield Haproxy(process.pid, f"http://127.0.0.1:{port}/v1/chat/completions")
    finally:
        os.unlink(config.name)


@dataclass(frozen=True)
class LoadRun:
    latencies: list[float]
    seconds: float
    cpu_us_per_request: dict[str, float]  # CPU time (user + system) each process spent per answered request
    cpu_wait_us_per_request: dict[str, float]  # time each process's event loop waited for a core, per request

    @property
    def rps(self) -> float:
        return round(len(self.latencies) / self.seconds, 1)

    def percentile_ms(self, q: int) -> float:
        return round(statistics.quantiles(self.latencies, n=100)[q - 1] * 1000, 2)


def _report(direct: LoadRun, through: LoadRun) -> dict:
    return {
        "rps": through.rps,
        "ratio": round(through.rps / direct.rps, 3),
        "direct_p50_ms": direct.percentile_ms(50),
        "direct_p99_ms": direct.percentile_ms(99),
        "gateway_p50_ms": through.percentile_ms(50),
        "gateway_p99_ms": through.percentile_ms(99),
        "overhead_p50_ms": round(through.percentile_ms(50) - direct.percentile_ms(50), 2),
        "overhead_p99_ms": round(through.percentile_ms(99) - direct.percentile_ms(99), 2),
        "direct_rps": direct.rps,
        "cpu_us_per_request": through.cpu_us_per_request,
        "cpu_wait_us_per_request": through.cpu_wait_us_per_request,
    }


def _measured(url: str, headers: dict, clients: int, seconds: float, rate: float, servers: dict) -> LoadRun:
    """A warm-up first (every worker thread opens its database connection, caches fill), then the measurement, with
    what the load generator (this process) and each of `servers` ({name: [pid, ...]}) spent per request: CPU time
    (on a shared machine wall-clock rates move with the neighbours' load, CPU per request much less) and time the
    main thread (the event loop) spent runnable but waiting for a core: the delay the neighbours' load added."""
    _run_load(url, headers, clients, WARM_UP_SECONDS, rate)
    processes = {"load_generator": [os.getpid()], **servers}
    before = {name: _totals(pids) for name, pids in processes.items()}
    latencies, wall = _run_load(url, headers, clients, seconds, rate)
    after = {name: _totals(pids) for name, pids in processes.items()}
    answered = max(1, len(latencies))

    def per_request(index: int) -> dict:
        return {name: round((after[name][index] - before[name][index]) * 1e6 / answered, 1) for name in processes}

    return LoadRun(latencies, wall, per_request(0), per_request(1))


def _totals(pids: list[int]) -> tuple[float, float]:
    """Of these processes so far: CPU seconds, user + system, all threads (/proc/<pid>/stat fields 14 and 15), and
    seconds the main thread waited on the run queue (/proc/<pid>/schedstat, field 2, ns)."""
    cpu = wait = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        wait += int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    return cpu, wait


def _run_load(url: str, headers: dict, clients: int, seconds: float, rate: float) -> tuple[list[float], float]:
    """`clients` keep-alive connections sending for `seconds`, back to back or paced to `rate` in all: every
    latency, and how long it took. A minimal HTTP/1.1 client on uvloop driven by callbacks (no coroutine, task or
    stream per request), so the load generator costs as little as possible of the CPU the servers share."""
    parts = urlsplit(url)
    payload = json.dumps(BODY).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    interval = clients / rate if rate else 0.0
    latencies: list[float] = []

    async def all_clients() -> float:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        finished = [loop.create_future() for _ in range(clients)]
        started = time.monotonic()
        for n, done in enumerate(finished):
            client = _Client(request, deadline, interval, interval * n / clients, latencies, done)
            await loop.create_connection(lambda client=client: client, parts.hostname, parts.port)
        await asyncio.gather(*finished)
        return time.monotonic() - started

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        wall = runner.run(all_clients())
    return latencies, wall


CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


class _Client(asyncio.Protocol):
    """One keep-alive connection: sends the request, reads the answer (status 200, Content-Length body), records
    the latency and sends the next one at once (closed loop) or at its next slot (paced), until the deadline."""

    def __init__(self, request: bytes, deadline: float, interval: float, offset: float, latencies: list, done):
        self.request, self.deadline, self.interval, self.offset = request, deadline, interval, offset
        self.latencies, self.done = latencies, done
        self.buffer = b""
        self.sent_at = self.next_send = 0.0

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop = asyncio.get_running_loop()
        self.next_send = self.loop.time() + self.offset
        self.loop.call_at(self.next_send, self.send)

    def send(self):
        self.sent_at = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes):
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buffer[: head_end + 2]
        length = CONTENT_LENGTH.search(head)
        if not head.startswith(b"HTTP/1.1 200 ") or length is None:
            self._finish(RuntimeError(f"Unexpected answer: {head.splitlines()[0].decode(errors='replace')}"))
            return
        end = head_end + 4 + int(length[1])
        if len(self.buffer) < end:
            return
        self.latencies.append(time.perf_counter() - self.sent_at)
        self.buffer = self.buffer[end:]
        now = self.loop.time()
        self.next_send = max(self.next_send + self.interval, now) if self.interval else now
        if self.next_send >= self.deadline:
            self._finish(None)
        elif self.interval:
            self.loop.call_at(self.next_send, self.send)
        else:
            self.send()

    def connection_lost(self, exc):
        self._finish(exc or ConnectionError("The server closed the connection"))

    def _finish(self, error: BaseException | None):
        if not self.done.done():
            self.done.set_exception(error) if error else self.done.set_result(None)
        self.transport.close()


def _deployment(replica_url: str) -> tuple[str, str]:
    """A served request with one healthy replica and a key, written straight into the database."""
    from catalog.choices import ServiceKind
    from catalog.models import Service
    from requests.choices import RequestState
    from requests.models import ResourceRequest
    from requests.models.request import snapshot_hash
    from serving.choices import DeploymentState
    from serving.keys import api_key_create
    from serving.models import ServingDeployment, ServingReplica
    from tenancy.choices import Role
    from tenancy.models import Project, Tenant, User
    from tenancy.services import membership_grant

    stamp = time.time_ns() // 1000
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
        state=DeploymentState.SERVING,
        rate_limit_per_minute=100_000_000,  # on, and checked every call, but not in the way
        monthly_token_budget=10**15,
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
        "serving.inference_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        BODY["model"],
        "--replica",
        "replica-0",
    ]


def _gateway_command(port: int, reuse_port: bool) -> list[str]:
    command = [sys.executable, "manage.py", "run_gateway", "--port", str(port)]
    return [*command, "--reuse-port"] if reuse_port else command


def _gateway_env() -> dict:
    """The gateway processes use this process's database (a test run's test database included)."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(settings.DATABASES["default"]),
        "DEBUG": "0",
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only"),
        "METRICS_TOKEN": os.environ.get("METRICS_TOKEN") or "bench-only",
        "SECURE_SSL_REDIRECT": "0",  # plain HTTP on the loopback
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "REDIS_URL": REDIS_URL,
    }


@contextmanager
def _process(command: list[str], env: dict | None = None):
    process = subprocess.Popen(
        command, cwd=settings.BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, and the process's clean stop waited for (the gateway flushes its tallies then, which the report
    reads); one that does not stop within STOP_SECONDS is killed, never left running on the test database, and the
    run fails with that."""
    process.terminate()
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
