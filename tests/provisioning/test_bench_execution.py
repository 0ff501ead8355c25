"""`python -m bench execution` measures the platform beside the backend alone, in the same run: on a real Slurm
cluster (and on this machine's podman), rounds that alternate which goes first, each round's requests active and then
released so the next finds the cluster empty, each measurement begun on quiet workers and daemons, the baseline's
jobs all RUNNING and cancelled, and where a request's time went."""

import json
import statistics
from io import StringIO

import pytest
from django.core.management import call_command

from bench.execution import Command as BenchExecution
from requests.choices import RequestState
from requests.models import ResourceRequest

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def test_slurm_rounds_put_the_platform_beside_slurm_alone():
    out = StringIO()
    call_command(
        BenchExecution(), backend="slurm", requests=4, rounds=2, workers=2, as_json=True, force=True, stdout=out
    )
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    assert (report["requests"], report["rounds"], report["active"], report["direct_active"]) == (4, 2, 4, 4)
    assert report["direct_jobs_per_s"] > 0 and report["direct_p50_s"] > 0
    rounds = report["per_round"]
    assert [r["first"] for r in rounds] == ["direct", "platform"]
    assert [r["phase_s"] for r in rounds] == [0.0, 0.618]  # both sides of a round begin there in the second
    for measured in rounds:
        assert measured["ratio"] == round(measured["platform"]["jobs_per_s"] / measured["direct"]["jobs_per_s"], 3)
        assert measured["direct"]["calls"]["submit"]["count"] == 4
        assert len(measured["load_avg"]) == 2
        # each measurement began once the workers, the broker and Slurm were quiet again
        assert set(measured["quiet_wait_s"]) == {"direct", "platform"}
        assert all(seconds >= 0 for seconds in measured["quiet_wait_s"].values())
        # the platform's submissions come after its cycle, the baseline's from its own clock's start; both before
        # the last of their jobs is seen RUNNING
        first, last = measured["platform"]["started_s"]
        assert 0 < first <= last <= measured["platform"]["wall_s"]
        first, last = measured["direct"]["started_s"]
        assert first == 0.0 and 0 < last <= measured["direct"]["wall_s"]
    assert report["ratio"] == pytest.approx(statistics.median(r["ratio"] for r in rounds), abs=2e-3)
    parts = report["breakdown"]
    for part in ("cycle_s", "allocated (cycle)", "start_workload: queued", "start_workload: in a worker", "to active"):
        assert parts[part] >= 0, part
    assert "deferred" in parts["reconciler"]
    # every round's requests (and the unmeasured warm-up wave's) went active and were released again
    states = set(ResourceRequest.objects.values_list("state", flat=True))
    assert states == {RequestState.RELEASED} and ResourceRequest.objects.count() == 4 * (2 + 1)


def test_container_rounds_put_the_platform_beside_podman_alone():
    """The same on this machine's podman: each side's containers started with the driver's own `podman run` options
    (a change to the driver's options that the baseline does not follow fails here) and timed to their sshd."""
    out = StringIO()
    call_command(
        BenchExecution(), backend="container", requests=2, rounds=1, workers=2, as_json=True, force=True, stdout=out
    )
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    assert (report["backend"], report["active"], report["direct_active"]) == ("container", 2, 2)
    [measured] = report["per_round"]
    assert measured["direct"]["calls"]["podman run"]["count"] == 2
    assert measured["ratio"] == round(measured["platform"]["jobs_per_s"] / measured["direct"]["jobs_per_s"], 3)
    first, last = measured["platform"]["started_s"]
    assert 0 < first <= last <= measured["platform"]["wall_s"]
    first, last = measured["direct"]["started_s"]
    assert first == 0.0 and 0 < last <= measured["direct"]["wall_s"]
    states = set(ResourceRequest.objects.values_list("state", flat=True))
    assert states == {RequestState.RELEASED} and ResourceRequest.objects.count() == 2 * (1 + 1)
