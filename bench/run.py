"""`make bench`: run every benchmark on a scratch PostgreSQL database and write docs/BENCHMARKS.md; `python -m
bench.run NAME ...` runs some of them and prints their rows and opening-table lines.

Each benchmark module exposes TITLE, DESCRIPTION, TARGET, run() -> list of row dicts (same keys in every row) and
headline(rows) -> bench.headline.Headline (the figure its target is about, and the baseline of the same run).
"""

import argparse
import importlib
import os
import platform
import subprocess
import sys
import warnings
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench import ORDER_CAP_SETTINGS
from bench.headline import table

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = [
    "bench.report.catalog_api",
    "bench.report.requests",
    "bench.report.api_load",
    "bench.report.scheduler",
    "bench.report.scale",
    "bench.report.steady",
    "bench.report.start_accuracy",
    "bench.report.preview",
    "bench.report.placement",
    "bench.report.mig",
    "bench.report.gang",
    "bench.report.gang_replay",
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


def _short_name(module_name: str) -> str:
    return module_name.rsplit(".", 1)[1]


def _chosen(names: list[str]) -> list[str]:
    """The benchmarks named on the command line (by their short name), or all of them."""
    by_name = {_short_name(module): module for module in BENCHMARKS}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise SystemExit(f"Unknown benchmarks: {', '.join(unknown)}; choose from {', '.join(by_name)}")
    return [by_name[name] for name in names] if names else BENCHMARKS


def _settings_for_benchmarks() -> str:
    """A fresh scratch database and the production settings pointed at it; PostgreSQL's version."""
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
    return postgres_version


def _summary_line(module, rows: list[dict], date: str) -> dict:
    headline = module.headline(rows)
    return {
        "benchmark": module.TITLE,
        "command": f"`python -m bench.run {_short_name(module.__name__)}`",
        "today": headline.figure,
        "baseline (same run)": headline.baseline,
        "target": module.TARGET,
        "date": date,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="Short names (e.g. placement faults); all when none is given.")
    names = _chosen(parser.parse_args(argv).names)
    postgres_version = _settings_for_benchmarks()
    commit = (
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        or "uncommitted"
    )
    date = f"{datetime.now(UTC):%Y-%m-%d}"
    summary, sections = [], []
    for name in names:
        module = importlib.import_module(name)
        print(f"running {module.TITLE} ...", flush=True)
        rows = module.run()
        summary.append(_summary_line(module, rows, date))
        sections += ["", f"## {module.TITLE}", "", module.DESCRIPTION, "", table(rows)]
        print(table(rows), flush=True)
    print("", table(summary), sep="\n")
    if names != BENCHMARKS:
        return 0  # a part of the benchmarks: printed, docs/BENCHMARKS.md keeps its whole run
    header = [
        "# Benchmarks",
        "",
        "Written by `make bench` (bench/run.py); numbers from the last run. Speed targets live here, never in "
        "timed unit tests. Each line's command runs that benchmark alone and prints its table and this line. "
        "Earlier runs and the work behind each figure: [benchmarks/history.md](benchmarks/history.md).",
        "",
        f"- Date: {date} UTC, commit {commit}",
        f"- Machine: {_machine()}",
        f"- Python {platform.python_version()}, PostgreSQL {postgres_version}, Django in-process test client",
        "",
        table(summary),
        "",
        "# Method and the last run's rows",
    ]
    (ROOT / "docs" / "BENCHMARKS.md").write_text("\n".join(header + sections) + "\n")
    print("wrote docs/BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
