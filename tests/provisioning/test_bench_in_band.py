"""`python -m bench in_band` runs every in-band step of the bare-metal pipeline through the `ansible` driver on a real
test host, first and again, the way the steps call it: a change to a driver method that the benchmark does not
follow fails here, not on the next `make bench`."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from bench.in_band import STEPS
from bench.in_band import Command as BenchInBand


def test_one_host_s_in_band_steps_are_timed_and_change_nothing_when_run_again():
    out = StringIO()
    call_command(BenchInBand(), hosts=1, as_json=True, stdout=out)

    rows = {row["step"]: row for row in map(json.loads, out.getvalue().strip().splitlines())}
    assert list(rows) == [*STEPS, "all in-band steps", "deregister_cluster"]
    assert all(row["first_s"] > 0 and row["rerun_s"] > 0 and row["rerun_changed"] == 0 for row in rows.values())
    # each row rounded on its own: the sum of the rounded steps is within their rounding of the whole
    assert rows["all in-band steps"]["rerun_s"] == pytest.approx(sum(rows[step]["rerun_s"] for step in STEPS), abs=0.03)
