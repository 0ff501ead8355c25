"""The preview benchmark command reports what the issue asks for, from a real cycle's outcome."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from bench.preview import Command as BenchPreview
from requests.models import ResourceRequest
from tests.scheduling import test_bench_scheduler

pytestmark = pytest.mark.django_db
nodes_csv = test_bench_scheduler.nodes_csv


def test_bench_preview_reports_latency_and_queries_at_a_queue_length(nodes_csv):
    out = StringIO()
    call_command(BenchPreview(), nodes=nodes_csv, queued=40, previews=12, as_json=True, force=True, stdout=out)
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    assert set(report) == {"queued", "p50_ms", "p95_ms", "first_of_shape_ms", "queries"}
    fastest_first, slowest_first = map(float, report["first_of_shape_ms"].split("-"))
    assert 0 < fastest_first <= slowest_first
    assert report["queued"] == ResourceRequest.objects.filter(state="queued").count() >= 40
    assert 0 < report["p50_ms"] <= report["p95_ms"] and 0 < report["queries"] <= 6


def test_bench_preview_refuses_a_database_not_meant_for_it(nodes_csv):
    with pytest.raises(CommandError, match="_bench"):
        call_command(BenchPreview(), nodes=nodes_csv, queued=1)
