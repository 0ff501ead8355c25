"""The scheduler benchmark command runs one real cycle and reports what the issue asks for."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from bench.scheduler import Command as BenchScheduler
from requests.models import ResourceRequest
from scheduling.models import Allocation

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes_csv(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nb-0,96000,393216,8,G2\nb-1,64000,262144,2,T4\n")
    return path


def test_bench_scheduler_reports_one_cycle(nodes_csv):
    out = StringIO()
    call_command(BenchScheduler(), nodes=nodes_csv, requests=40, as_json=True, force=True, stdout=out)
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    assert set(report) == {"requests", "allocated", "cycle_seconds", "allocated_per_s", "queries_per_cycle"}
    assert report["requests"] == 40
    assert 0 < report["allocated"] == Allocation.objects.count() < 40  # 10 GPUs cannot hold 40 requests
    assert ResourceRequest.objects.filter(state="queued").exclude(queue_reason={}).count() == 40 - report["allocated"]


def test_bench_scheduler_refuses_a_database_not_meant_for_it(nodes_csv):
    with pytest.raises(CommandError, match="_bench"):
        call_command(BenchScheduler(), nodes=nodes_csv, requests=1)
