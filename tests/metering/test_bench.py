"""The metering benchmark command generates its month of usage and reports what the issue asks for."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from bench.metering import Command as BenchMetering
from metering.models import DailyUsage, TelemetrySample
from scheduling.models import Allocation

pytestmark = pytest.mark.django_db


def test_bench_metering_generates_rolls_up_and_times_the_report():
    out = StringIO()
    call_command(BenchMetering(), samples=600, allocations=150, as_json=True, force=True, stdout=out)
    report = json.loads(out.getvalue())
    assert {"samples", "allocations", "report_seconds"} <= set(report)
    assert (report["samples"], report["allocations"]) == (600, 150)
    assert Allocation.objects.filter(request__project__slug__startswith="bench-metering-").count() == 150
    assert TelemetrySample.objects.count() == 600 and DailyUsage.objects.exists()
    assert report["groups"] > 0 and report["report_seconds"] >= 0


def test_bench_metering_refuses_a_database_not_meant_for_it():
    with pytest.raises(CommandError, match="_bench"):
        call_command(BenchMetering(), samples=1, allocations=1)
