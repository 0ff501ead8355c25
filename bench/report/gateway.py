"""The model-serving gateway's throughput and added latency under load on loopback, haproxy as the ceiling."""

import json
from io import StringIO

from django.core.management import call_command

from bench.gateway import Command as BenchGateway
from bench.headline import Headline

TITLE = "Model-serving gateway"
CLIENTS, SECONDS, PACED_RPS = 50, 20, 500
DESCRIPTION = (
    f"`python -m bench gateway --clients {CLIENTS} --seconds {SECONDS} --rate {PACED_RPS} --engine`: the project's "
    "stand-in inference server alone, behind haproxy (the ceiling: a proxy that only proxies) and behind the gateway "
    "(`run_gateway`, one aiohttp process, on this database and Redis: key check, rate limit, token budget and "
    f"metering all on), the same non-streaming chat request from {CLIENTS} keep-alive clients after a warm-up. "
    "Closed loop: each client sends its next request when the answer arrives (throughput; `ratio` = gateway / "
    f"direct). Paced: {PACED_RPS} requests/s in all (the latency the gateway adds below saturation). Targets: "
    ">= 2,000 req/s and ratio >= 0.35 closed loop, p99 overhead <= 10 ms paced. Engine: SmolLM2-135M on llama.cpp "
    "(2 threads), completion tokens/s from 2 clients straight and through the gateway. Load generator, servers, "
    "Redis and PostgreSQL share the machine's cores; `cpu_us_per_request` (CPU per request of each process) and "
    "`cpu_wait_us_per_request` (its event loop's wait for a core) say how much of a number is the machine's load."
)
TARGET = ">= 2,000 req/s and ratio >= 0.35 closed loop; paced p99 overhead <= 10 ms"


def headline(rows: list[dict]) -> Headline:
    best = max(rows, key=lambda row: row["rps"])
    return Headline(
        f"{best['rps']} req/s (ratio {best['ratio']}), paced p99 overhead {best.get('paced_overhead_p99_ms', '-')} ms",
        f"the runtime direct {best['direct_rps']} req/s, haproxy {best.get('haproxy_rps', '-')} req/s",
    )


def run() -> list[dict]:
    out = StringIO()
    call_command(
        BenchGateway(), clients=CLIENTS, seconds=SECONDS, rate=PACED_RPS, engine=True, as_json=True, stdout=out
    )
    return [json.loads(out.getvalue())]
