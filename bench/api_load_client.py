"""The API load benchmark's simulated users, in their own process: `python -m bench.api_load_client PLAN.json
PHASE` (warmup, mix or submit).

Imports nothing from Django (it only speaks HTTP). The plan (written by bench/report/api_load.py) names the
server, the users with their tokens and projects, and the catalog ids to order. Three phases, each bounded by time
and by a request count, and a JSON report on stdout:

- `mix`: every user waits a think time (exponential, mean `think_ms`; the first too, so users do not all start at
  once) and acts, again and again. Developers order (preview, then submit; orders of 4 cards and more go to their
  project's approver), open one of their requests, list their requests and look at the queue; approvers read
  their inbox and approve the oldest task; operators list everything and read the queue. Latency p50/p99 per
  endpoint, requests/s.
- `warmup`: the mix for `warmup_s`, reported but not measured: each gunicorn worker's first calls import what it
  imports lazily, connect to the database and build what it keeps (the orderable catalog...); a server that has
  been up a while has done all that.
- `submit`: `users` clients in a closed loop (no think time) submitting small orders, which are approved on
  submission and queued: submissions/s through HTTP.
"""

import asyncio
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import aiohttp

REQUESTS, PREVIEW, QUEUE, APPROVALS = (
    "/api/v1/requests/",
    "/api/v1/requests/preview/",
    "/api/v1/queue/",
    "/api/v1/approvals/",
)


class Recorder:
    def __init__(self, limit: int, seconds: float):
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.statuses: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.limit, self.deadline = limit, time.monotonic() + seconds
        self.sent = 0

    def open(self) -> bool:
        return self.sent < self.limit and time.monotonic() < self.deadline

    async def think(self, rng: random.Random, mean_ms: float) -> None:
        """An exponential think time around `mean_ms`, cut at the deadline: a user still thinking when the phase
        ends would stretch the phase it is counted over (by seconds at a human pace) without calling."""
        wanted = rng.expovariate(1000 / mean_ms) if mean_ms else 0
        await asyncio.sleep(max(0.0, min(wanted, self.deadline - time.monotonic())))

    async def call(self, http, endpoint: str, method: str, path: str, token: str, body=None):
        self.sent += 1
        started = time.perf_counter()
        async with http.request(method, path, json=body, headers={"Authorization": f"Token {token}"}) as answer:
            payload = await answer.json(content_type=None)
        self.latencies[endpoint].append((time.perf_counter() - started) * 1000)
        self.statuses[endpoint][answer.status] += 1
        return answer.status, payload


def _order(plan, user, rng, large: bool) -> dict:
    specs = plan["large_specs"] if large else plan["small_specs"]
    return {
        "service": plan["service"],
        "project": user["project"],
        "spec": rng.choice(specs),
        "image": plan["image"],
        "duration_hours": rng.choice([4, 8, 24]),
    }


async def _developer(http, plan, user, rng, record: Recorder):
    mine = list(user["request_ids"])
    action = rng.choices(["order", "detail", "list", "queue"], weights=[30, 30 if mine else 0, 25, 15])[0]
    token = user["token"]
    if action == "order":
        order = _order(plan, user, rng, large=rng.random() < plan["large_share"])
        await record.call(http, "preview", "POST", PREVIEW, token, order)
        status, body = await record.call(http, "submit", "POST", REQUESTS, token, order)
        if status == 201:
            user["request_ids"].append(body["id"])
    elif action == "detail":
        await record.call(http, "detail", "GET", f"{REQUESTS}{rng.choice(mine)}/", token)
    elif action == "list":
        await record.call(http, "list", "GET", REQUESTS, token)
    else:
        await record.call(http, "queue", "GET", QUEUE, token)


async def _approver(http, plan, user, rng, record: Recorder):
    status, inbox = await record.call(http, "inbox", "GET", APPROVALS, user["token"])
    if status == 200 and inbox["results"] and record.open():
        task = inbox["results"][0]["id"]
        await record.call(http, "approve", "POST", f"{APPROVALS}{task}/approve/", user["token"], {"comment": "ok"})


async def _operator(http, plan, user, rng, record: Recorder):
    if rng.random() < 0.5:
        await record.call(http, "list (operator)", "GET", REQUESTS, user["token"])
    else:
        await record.call(http, "queue (operator)", "GET", QUEUE, user["token"])


ROLES = {"developer": _developer, "approver": _approver, "operator": _operator}


async def _mix(http, plan, record: Recorder):
    async def user_loop(user, n):
        rng = random.Random(plan["seed"] * 1000 + n)
        # Every user thinks before its first call as between calls, so the phase opens with users in their stride:
        # all 50 calling at its first instant queued 50 calls at once, its slowest second and no steady load's.
        while True:
            await record.think(rng, plan["think_ms"])
            if not record.open():
                return
            await ROLES[user["role"]](http, plan, user, rng, record)

    await asyncio.gather(*(user_loop(user, n) for n, user in enumerate(plan["users"])))


async def _submit(http, plan, record: Recorder):
    developers = [user for user in plan["users"] if user["role"] == "developer"]

    async def client(n):
        rng, user = random.Random(plan["seed"] * 7 + n), developers[n % len(developers)]
        while record.open():
            await record.call(
                http, "submit (closed loop)", "POST", REQUESTS, user["token"], _order(plan, user, rng, False)
            )

    await asyncio.gather(*(client(n) for n in range(len(plan["users"]))))


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 1)


def _report(record: Recorder, seconds: float) -> dict:
    return {
        "seconds": round(seconds, 2),
        "requests": sum(len(values) for values in record.latencies.values()),
        "requests_per_s": round(sum(len(values) for values in record.latencies.values()) / seconds, 1),
        "endpoints": {
            endpoint: {
                "count": len(values),
                "per_s": round(len(values) / seconds, 1),
                "p50_ms": _percentile(values, 0.5),
                "p99_ms": _percentile(values, 0.99),
                "statuses": dict(record.statuses[endpoint]),
            }
            for endpoint, values in sorted(record.latencies.items())
        },
    }


async def _phase(plan, run, seconds: float, limit: int) -> dict:
    record = Recorder(limit, seconds)
    connector = aiohttp.TCPConnector(limit=len(plan["users"]))
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(plan["base_url"], connector=connector, timeout=timeout) as http:
        started = time.monotonic()
        await run(http, plan, record)
        return _report(record, time.monotonic() - started)


def main(path: str, phase: str) -> int:
    plan = json.loads(Path(path).read_text())
    phases = {
        "warmup": (_mix, plan["warmup_s"]),
        "mix": (_mix, plan["duration_s"]),
        "submit": (_submit, plan["submit_s"]),
    }
    run, seconds = phases[phase]
    print(json.dumps({phase: asyncio.run(_phase(plan, run, seconds, plan["max_requests"]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
