"""The gateway benchmark runs end to end (tiny load): a real gunicorn in front of a real inference server."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from metering.models import TokenUsage


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize("rate", [0, 20])
def test_bench_gateway_reports_both_paths(rate):
    out = StringIO()
    call_command("bench_gateway", clients=4, seconds=1, rate=rate, as_json=True, stdout=out)
    report = json.loads(out.getvalue())
    assert report["clients"] == 4 and report["rps"] > 0 and report["direct_rps"] > 0
    assert report["gateway_p99_ms"] >= report["gateway_p50_ms"] > 0
    assert set(report) >= {"direct_p50_ms", "direct_p99_ms", "gateway_p50_ms", "gateway_p99_ms", "overhead_p99_ms"}
    assert TokenUsage.objects.get().requests > 0  # the gateway metered what it served
