"""The model-serving gateway's added latency under load on loopback."""

import json
from io import StringIO

from django.core.management import call_command

TITLE = "Model-serving gateway"
CLIENTS, SECONDS, PACED_RPS = 50, 20, 100
DESCRIPTION = (
    f"`manage.py bench_gateway --clients {CLIENTS} --seconds {SECONDS} [--rate {PACED_RPS}]`: the project's inference "
    f"server alone, then behind the gateway (gunicorn, 2 workers x 32 threads, on this database: key check, rate "
    "limit, routing, token metering per answer), the same non-streaming chat request from "
    f"{CLIENTS} keep-alive clients after a warm-up. Closed loop: each client sends its next request when the answer "
    f"arrives (measures throughput; latency is then mostly queueing). Paced: {PACED_RPS} requests/s in all (the "
    "latency the gateway adds below saturation). Target: p99 overhead under 20 ms. Load generator, servers and "
    "PostgreSQL share the machine's cores."
)


def run() -> list[dict]:
    rows = []
    for mode, rate in (("closed loop", 0), (f"paced {PACED_RPS}/s", PACED_RPS)):
        out = StringIO()
        call_command("bench_gateway", clients=CLIENTS, seconds=SECONDS, rate=rate, as_json=True, stdout=out)
        report = json.loads(out.getvalue())
        report.pop("offered_rps")
        rows.append({"load": mode, **report})
    return rows
