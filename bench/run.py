"""`make bench`: run every benchmark on a scratch PostgreSQL database and write docs/BENCHMARKS.md.

Each benchmark module exposes TITLE, DESCRIPTION and run() -> list of row dicts (same keys in every row).
"""

import os
import platform
import subprocess
import sys
import warnings
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench import ORDER_CAP_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = [
    "bench.report.catalog_api",
    "bench.report.requests",
    "bench.report.api_load",
    "bench.report.scheduler",
    "bench.report.scale",
    "bench.report.steady",
    "bench.report.preview",
    "bench.report.placement",
    "bench.report.mig",
    "bench.report.metering",
    "bench.report.gateway",
    "bench.report.execution",
    "bench.report.execution_container",
    "bench.report.in_band_ansible",
    "bench.report.bare_metal_path",
    "bench.faults",
]
SERVER_URL = os.environ.get("BENCH_DATABASE_SERVER", "postgres://postgres@127.0.0.1:5432")
DATABASE = "compute_catalog_bench"


def _fresh_database() -> str:
    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
        version = connection.execute("SHOW server_version").fetchone()[0]
    return version


def _machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    memory_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    return f"{os.cpu_count()} cores, {cpu}, {memory_kb / 1024 / 1024:.0f} GiB RAM"


def _table(rows: list[dict]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[key]) for key in header) + " |" for row in rows]
    return "\n".join(lines)


def main() -> int:
    postgres_version = _fresh_database()
    os.environ.update(
        DATABASE_URL=f"{SERVER_URL}/{DATABASE}",
        SECRET_KEY="bench-only",
        METRICS_TOKEN="bench-only",
        SECURE_SSL_REDIRECT="0",  # the in-process test client speaks plain HTTP
        **dict.fromkeys(ORDER_CAP_SETTINGS, "0"),
        DEBUG="0",
        ALLOWED_HOSTS="testserver",
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    import django

    warnings.filterwarnings("ignore", message="No directory at")  # WhiteNoise: no collectstatic for benchmarks
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    commit = (
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        or "uncommitted"
    )
    sections = [
        "# Benchmarks",
        "",
        "Written by `make bench` (bench/run.py); numbers from the last run. Speed targets live here, never in "
        "timed unit tests.",
        "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}",
        f"- Machine: {_machine()}",
        f"- Python {platform.python_version()}, PostgreSQL {postgres_version}, Django in-process test client",
    ]
    for name in BENCHMARKS:
        module = __import__(name, fromlist=["run"])
        print(f"running {module.TITLE} ...", flush=True)
        rows = module.run()
        sections += ["", f"## {module.TITLE}", "", module.DESCRIPTION, "", _table(rows)]
        print(_table(rows), flush=True)
    (ROOT / "docs" / "BENCHMARKS.md").write_text("\n".join(sections) + "\n")
    print("wrote docs/BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
