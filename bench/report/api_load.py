"""The API under load: gunicorn on PostgreSQL and Redis, 50 simulated users, 100,000 requests, 1,000,000 events.

`python -m bench.report.api_load [--requests N] [--events M] [--users U] [--duration S] [--json]` (`make bench`
runs it with the issue's numbers through run()): a fresh scratch database, a month of history seeded with COPY
(bench/api_seed.py), one scheduling cycle over what it left queued, then gunicorn (gunicorn.conf.py,
loopback) and the simulated users in their own process (bench/api_load_client.py), bounded in time and count.
Reported: p50/p99 per endpoint, requests/s, submissions/s, the gunicorn workers' CPU time per request, the queries
each page costs at this size (the unit tests assert they do not grow: tests/requests/test_api.py), and
PostgreSQL rows and table/index sizes per table after the run (the month-size projection in docs/benchmarks/history.md).
"""

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg

from bench import ORDER_CAP_SETTINGS
from bench.headline import Headline, row_where
from config.probes import wait_until_answers

ROOT = Path(__file__).resolve().parents[2]
SERVER_URL = os.environ.get("BENCH_DATABASE_SERVER", "postgres://postgres@127.0.0.1:5432")
DATABASE = os.environ.get("BENCH_API_DATABASE", "compute_catalog_bench_api")
REDIS_URL = os.environ.get("BENCH_API_REDIS_URL", "redis://127.0.0.1:6379/13")
TITLE = "API under load (issue 19: gunicorn, 50 users, 100,000 requests, 1,000,000 events)"
DESCRIPTION = (
    "`python -m bench.report.api_load --json`: a month of history COPYed into a fresh database (200 projects "
    "in 20 tenants with Zipf-weighted traffic, 1,000 users, 100,000 requests over 30 days, 1,000,000 timeline "
    "events, the allocations of the requests that ran; shape in bench/api_seed.py), one scheduling cycle on "
    "the openb fleet, then gunicorn (sync "
    "workers, loopback, Redis broker and cache) and 50 simulated users in their own aiohttp process: 40 "
    "developers (preview + submit, request detail, their list, the queue), 8 approvers (inbox, approve) and 2 "
    "operators (everything's list and queue), think time exponential around 500 ms, for 60 s (after 10 s of the "
    "same, not measured: each worker's first calls import, connect and build what it keeps); then 20 s of "
    "closed-loop submissions from 50 clients. p50/p99 per endpoint; `queries` is one call of the page at this "
    "size; each phase's CPU per request served, gunicorn's workers and PostgreSQL's server apart. Targets: p99 <= "
    "250 ms for detail, list and queue; >= 100 submissions/s. Client, gunicorn, PostgreSQL and Redis share the "
    "machine's 2 cores."
)
TARGET = "p99 <= 250 ms for detail, list and queue; >= 100 submissions/s"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _fresh_database() -> dict:
    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
    env = {
        **os.environ,
        "DATABASE_URL": f"{SERVER_URL}/{DATABASE}",
        "REDIS_URL": REDIS_URL,
        "SECRET_KEY": "bench-only",
        "METRICS_TOKEN": "bench-only",
        "SECURE_SSL_REDIRECT": "0",  # plain HTTP on the loopback
        **dict.fromkeys(ORDER_CAP_SETTINGS, "0"),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,testserver",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def gunicorn(env: dict, workers: int):
    """gunicorn serving the project on a free loopback port until the block ends; yields (base URL, master pid)."""
    port = _free_port()
    command = [sys.executable, "-m", "gunicorn", "config.wsgi", "-c", "gunicorn.conf.py"]
    command += ["--bind", f"127.0.0.1:{port}", "--workers", str(workers), "--log-level", "warning"]
    with tempfile.TemporaryFile("w+") as log:  # django-q logs every enqueue: kept out of the report, shown on failure
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_answers(f"{base}/healthz", seconds=60, process=server)
            yield base, server.pid
        except BaseException:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise
        finally:
            server.terminate()
            server.wait(timeout=30)


def _cpu_seconds(pids) -> float:
    """User + system CPU of these processes so far (from /proc; one gone meanwhile counts nothing)."""
    stats = [_stat(Path(f"/proc/{pid}")) for pid in pids]
    return sum(int(fields[11]) + int(fields[12]) for fields in stats if fields) / os.sysconf("SC_CLK_TCK")


def _gunicorn_pids(master: int) -> list[int]:
    return [master, *map(int, Path(f"/proc/{master}/task/{master}/children").read_text().split())]


def _postgres_cpu_seconds() -> float:
    """CPU of the PostgreSQL server so far: its processes alive now, and those that ended (a backend whose
    connection closed, an autovacuum worker), whose time the postmaster collected when it reaped them."""
    alive = [pid for pid in Path("/proc").iterdir() if pid.name.isdigit() and _command(pid) == "postgres"]
    stats = {int(pid.name): _stat(pid) for pid in alive}
    stats = {pid: fields for pid, fields in stats.items() if fields}
    postmaster = next((fields for fields in stats.values() if int(fields[1]) not in stats), None)
    ticks = sum(int(fields[11]) + int(fields[12]) for fields in stats.values())
    ticks += int(postmaster[13]) + int(postmaster[14]) if postmaster else 0
    return ticks / os.sysconf("SC_CLK_TCK")


def _stat(pid: Path) -> list[str]:
    """The fields of /proc/<pid>/stat after the command (state, ppid, ...), or none for a process gone."""
    try:
        return (pid / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _command(pid: Path) -> str:
    try:
        return (pid / "comm").read_text().strip()
    except OSError:
        return ""


def _phase(plan_path: str, phase: str, master: int, *, limit: float) -> dict:
    """One phase of the simulated users, with the CPU gunicorn and PostgreSQL spent on it per request served.
    PostgreSQL's share is its whole server's, so anything else using it on the machine counts too."""
    gunicorn_before, postgres_before = _cpu_seconds(_gunicorn_pids(master)), _postgres_cpu_seconds()
    out = subprocess.run(
        [sys.executable, "-m", "bench.api_load_client", plan_path, phase],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=limit,
    ).stdout
    numbers = json.loads(out)[phase]
    gunicorn_cpu = _cpu_seconds(_gunicorn_pids(master)) - gunicorn_before
    postgres_cpu = _postgres_cpu_seconds() - postgres_before
    served = max(1, numbers["requests"])
    numbers.update(
        gunicorn_cpu_s=round(gunicorn_cpu, 1),
        gunicorn_cpu_ms_per_request=round(gunicorn_cpu * 1000 / served, 1),
        postgres_cpu_ms_per_request=round(postgres_cpu * 1000 / served, 1),
    )
    return {phase: numbers}


def _people(seeded, users: int) -> list[dict]:
    """The simulated users: 80 % developers (one per project, the busiest projects first), 16 % approvers of the
    busiest projects, the rest operators."""
    from bench.api_seed import tokens_for
    from tests import factories

    approvers = max(1, round(users * 0.16))
    operators = max(0, min(users - approvers - 1, round(users * 0.04)))
    developers = users - approvers - operators
    people = []
    for n in range(developers):
        project = seeded.projects[n % len(seeded.projects)]
        team = seeded.developers[project.pk]
        people.append(("developer", team[(n // len(seeded.projects)) % len(team)], project))
    people += [("approver", seeded.approvers[project.pk], project) for project in seeded.projects[:approvers]]
    people += [("operator", factories.operator(), None) for _ in range(operators)]
    tokens = tokens_for([user for _role, user, _project in people])
    return [
        {
            "role": role,
            "token": token,
            "project": project.pk if project else None,
            "request_ids": _sample_ids(project) if role == "developer" else [],
        }
        for (role, _user, project), token in zip(people, tokens, strict=True)
    ]


def _sample_ids(project) -> list[int]:
    from requests.models import ResourceRequest

    return list(ResourceRequest.objects.filter(project=project).order_by("?").values_list("pk", flat=True)[:200])


def _page_queries(plan: dict) -> dict:
    """Queries of one call of each page at this size, as each role sees it (in process, the Django test client)."""
    from django.test import Client

    from tests.queries import queries_for as count_queries

    def client_of(role):
        user = next(user for user in plan["users"] if user["role"] == role)
        return user, Client(headers={"Authorization": f"Token {user['token']}"})

    def queries_for(client, url) -> int:
        client.get(url)  # the first call builds what a process keeps (the orderable catalog): a served page's cost
        return count_queries(client, url)  # is the second's

    developer, as_developer = client_of("developer")
    counts = {
        "list": queries_for(as_developer, "/api/v1/requests/"),
        "detail": queries_for(as_developer, f"/api/v1/requests/{developer['request_ids'][0]}/"),
        "queue": queries_for(as_developer, "/api/v1/queue/"),
        "inbox": queries_for(client_of("approver")[1], "/api/v1/approvals/"),
    }
    if any(user["role"] == "operator" for user in plan["users"]):
        as_operator = client_of("operator")[1]
        counts["list (operator)"] = queries_for(as_operator, "/api/v1/requests/")
        counts["queue (operator)"] = queries_for(as_operator, "/api/v1/queue/")
    return counts


def _vacuum_analyze() -> None:
    """Statistics and visibility maps for every table, as autovacuum keeps them in a running database (it may be
    off on a benchmark server, and a month of history COPYed in a minute is more than it would have caught up
    with): without them PostgreSQL plans the queue page against a users table it believes empty (a nested loop
    over every user, 80 ms) and counts a developer's list from the heap instead of the index."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _table_sizes() -> list[dict]:
    """Rows (exact), table and index bytes of every table that holds rows, largest first."""
    from django.db import connection

    _vacuum_analyze()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, pg_relation_size(relid), pg_indexes_size(relid), pg_total_relation_size(relid) "
            "FROM pg_stat_user_tables ORDER BY pg_total_relation_size(relid) DESC"
        )
        tables = cursor.fetchall()
        sizes = []
        for name, table, indexes, total in tables:
            cursor.execute(f'SELECT count(*) FROM "{name}"')
            rows = cursor.fetchone()[0]
            if rows:
                sizes.append(
                    {"table": name, "rows": rows, "table_bytes": table, "index_bytes": indexes, "total_bytes": total}
                )
    return sizes


def measure(args) -> dict:
    import redis
    from django.db import connection

    from bench.api_seed import seed
    from bench.report.scale import OPENB
    from requests.models import ResourceRequest
    from scheduling.cycle import run_cycle

    redis.from_url(REDIS_URL).flushdb()
    report = {"load_before": _load()}
    started = time.perf_counter()
    seeded = seed(
        nodes_csv=OPENB / "openb_node_list_gpu_node.csv",
        requests=args.requests,
        events=args.events,
        projects=args.projects,
    )
    report.update(seeded_requests=seeded.requests, seeded_events=seeded.events)
    report["seed_s"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    cycle = run_cycle()
    report.update(cycle_s=round(time.perf_counter() - started, 1), cycle_allocated=len(cycle.allocated))
    _vacuum_analyze()
    plan = {
        "seed": 42,
        "users": _people(seeded, args.users),
        "service": seeded.service.pk,
        "image": seeded.image.pk,
        "small_specs": [spec.pk for spec in seeded.specs if spec.accelerator_count < 4],
        "large_specs": [spec.pk for spec in seeded.specs if spec.accelerator_count >= 4],
        "large_share": 0.25,
        "think_ms": args.think_ms,
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "submit_s": args.submit_duration,
        "max_requests": args.max_requests,
    }
    report["queries"] = _page_queries(plan)
    report["requests_before"] = ResourceRequest.objects.count()
    connection.close()  # gunicorn's workers and the client get the database to themselves
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as plan_file:
        json.dump(plan, plan_file)
    try:
        with gunicorn(args.env, args.workers) as (base_url, master):
            plan["base_url"] = base_url
            Path(plan_file.name).write_text(json.dumps(plan))
            report["load_at_start"] = _load()
            phases = (("warmup", args.warmup), ("mix", args.duration), ("submit", args.submit_duration))
            for phase, seconds in phases:
                if seconds:
                    report.update(_phase(plan_file.name, phase, master, limit=seconds + 300))
            report["load_at_end"] = _load()
    finally:
        os.unlink(plan_file.name)
        redis.from_url(REDIS_URL).flushdb()
    served = report["mix"]["requests"] + report.get("submit", {}).get("requests", 0)
    report["gunicorn_cpu_s"] = sum(report[phase]["gunicorn_cpu_s"] for phase in ("mix", "submit") if phase in report)
    report["gunicorn_cpu_ms_per_request"] = round(report["gunicorn_cpu_s"] * 1000 / max(1, served), 1)
    report["requests_after"] = ResourceRequest.objects.count()
    report["tables"] = _table_sizes()
    return report


def rows(report: dict) -> list[dict]:
    """One row per endpoint and phase, for docs/benchmarks/history.md."""
    table = []
    for phase in ("mix", "submit"):
        for endpoint, numbers in report.get(phase, {}).get("endpoints", {}).items():
            table.append(
                {
                    "phase": phase,
                    "endpoint": endpoint,
                    "calls": numbers["count"],
                    "per s": numbers["per_s"],
                    "p50 ms": numbers["p50_ms"],
                    "p99 ms": numbers["p99_ms"],
                    "queries": report["queries"].get(endpoint, "-"),
                    "statuses": " ".join(f"{code}: {n}" for code, n in sorted(numbers["statuses"].items())),
                    "phase CPU ms a request (gunicorn + PostgreSQL)": f"{report[phase]['gunicorn_cpu_ms_per_request']}"
                    f" + {report[phase]['postgres_cpu_ms_per_request']}",
                    "load": f"{report['load_at_start']} - {report['load_at_end']}",
                }
            )
    return table


def headline(rows: list[dict]) -> Headline:
    mix = {row["endpoint"]: row for row in rows if row["phase"] == "mix"}
    p99 = "/".join(str(mix[endpoint]["p99 ms"]) for endpoint in ("detail", "list", "queue") if endpoint in mix)
    submit = row_where(rows, phase="submit", endpoint="submit (closed loop)")
    return Headline(f"p99 detail/list/queue {p99} ms; {submit['per s']} submissions/s")


def run() -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.report.api_load", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return rows(json.loads(out.strip().splitlines()[-1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--projects", type=int, default=200)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--warmup", type=float, default=10, help="Seconds of the mix before the measured one.")
    parser.add_argument("--duration", type=float, default=60, help="Seconds of the mixed phase.")
    parser.add_argument("--submit-duration", type=float, default=20, help="Seconds of closed-loop submissions.")
    parser.add_argument("--max-requests", type=int, default=200_000, help="Per phase, whatever the time.")
    parser.add_argument("--think-ms", type=float, default=500)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers.")
    parser.add_argument("--json", action="store_true", dest="as_json")
    args = parser.parse_args(argv)
    args.env = _fresh_database()
    os.environ.update(
        {
            key: args.env[key]
            for key in (
                "DATABASE_URL",
                "REDIS_URL",
                "SECRET_KEY",
                "METRICS_TOKEN",
                "SECURE_SSL_REDIRECT",
                *ORDER_CAP_SETTINGS,
                "DEBUG",
                "ALLOWED_HOSTS",
                "DJANGO_SETTINGS_MODULE",
            )
        }
    )
    import warnings

    import django

    warnings.filterwarnings("ignore", message="No directory at")  # WhiteNoise: no collectstatic for benchmarks
    django.setup()
    for noisy in ("django-q", "httpx"):  # one line per enqueued task or health probe
        logging.getLogger(noisy).setLevel(logging.WARNING)
    report = measure(args)
    if args.as_json:
        print(json.dumps(report))
    else:
        for row in rows(report):
            print(row)
        print({key: value for key, value in report.items() if key not in ("mix", "submit", "tables")})
        for table in report["tables"][:15]:
            print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
