"""The gateway benchmark runs end to end (tiny load): haproxy and a real gateway process in front of a real
inference server, with Redis, the key check, rate limit, budget and metering on."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from bench.gateway import Command as BenchGateway
from metering.models import TokenUsage


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_bench_gateway_reports_direct_haproxy_gateway_and_paced():
    out = StringIO()
    call_command(BenchGateway(), clients=4, seconds=1, rate=20, as_json=True, stdout=out)
    report = json.loads(out.getvalue())
    assert report["clients"] == 4 and report["rps"] > 0 and report["direct_rps"] > 0 and report["haproxy_rps"] > 0
    assert report["ratio"] == round(report["rps"] / report["direct_rps"], 3)
    assert report["gateway_p99_ms"] >= report["gateway_p50_ms"] > 0
    assert {"overhead_p50_ms", "overhead_p99_ms", "paced_overhead_p99_ms", "load_average"} <= set(report)
    assert report["metered_requests"] == TokenUsage.objects.get().requests > 0  # the gateway metered what it served
