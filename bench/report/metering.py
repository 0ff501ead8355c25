"""Metering on PostgreSQL: the monthly usage report over a million telemetry samples and 100,000 allocations."""

import json
from io import StringIO

from django.core.management import call_command

from bench.headline import Headline
from bench.metering import Command as BenchMetering

TITLE = "Metering report"
SAMPLES, ALLOCATIONS = 1_000_000, 100_000
DESCRIPTION = (
    f"`python -m bench metering --samples {SAMPLES} --allocations {ALLOCATIONS}`: a month of {ALLOCATIONS:,} "
    "allocations (1, 2, 4 and 8 whole cards and half-card shares of three models on 300 nodes; 2% still running) "
    f"for 40 projects in 8 tenants, their device bindings and {SAMPLES:,} one-minute telemetry samples, generated "
    "with generate_series. `rollup_seconds`: the samples rolled up into daily aggregates (percentiles, energy). "
    "`report_seconds`: the monthly report grouped by project, tenant, accelerator model, spec and month with "
    "card-hours, cost and energy, computed in the database. Target: report under 1 s."
)
TARGET = "monthly report < 1 s"


def headline(rows: list[dict]) -> Headline:
    (report,) = rows
    return Headline(f"report {report['report_seconds']} s over {report['samples']:,} samples")


def run() -> list[dict]:
    out = StringIO()
    call_command(BenchMetering(), samples=SAMPLES, allocations=ALLOCATIONS, as_json=True, stdout=out)
    return [json.loads(out.getvalue())]
