"""The opening table of docs/BENCHMARKS.md: every benchmark `make bench` runs names its target and reduces the rows
it returns to the figure the target is about, beside the baseline of the same run."""

import importlib

import pytest

from bench import faults
from bench.headline import NO_BASELINE, Headline, table
from bench.report import api_load, execution, execution_container, gateway, mig, placement, scale
from bench.run import BENCHMARKS, _chosen, _summary_line


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_names_its_target_and_its_headline(name):
    module = importlib.import_module(name)
    assert module.TARGET and callable(module.headline)


def test_the_api_under_load_is_read_at_its_targets_endpoints():
    rows = [
        {"phase": "mix", "endpoint": endpoint, "p99 ms": p99, "per s": 10}
        for endpoint, p99 in (("detail", 134.8), ("list", 119.1), ("queue", 116.5), ("approve", 2711.7))
    ] + [{"phase": "submit", "endpoint": "submit (closed loop)", "p99 ms": 900, "per s": 119.3}]

    assert api_load.headline(rows) == Headline("p99 detail/list/queue 134.8/119.1/116.5 ms; 119.3 submissions/s")


def test_placement_and_mig_give_their_baselines_from_the_same_run():
    rows = [
        {"trace": "synthetic", "policy": "fgd-plus", "alloc@100 %": "89.71 ± 1.20", "decisions/s": 4379},
        *(
            {"trace": "openb default", "policy": policy, "alloc@100 %": alloc, "decisions/s": 5000}
            for policy, alloc in (("fgd-plus", "94.90 ± 0.10"), ("fgd", "94.80 ± 0.20"), ("bestfit", "92.00 ± 0.30"))
        ),
    ]
    assert placement.headline(rows) == Headline(
        "openb default: fgd-plus alloc@100 94.90 ± 0.10 %, 5000 decisions/s",
        "fgd 94.80 ± 0.20 %, best-fit 92.00 ± 0.30 %",
    )
    mig_rows = [
        {"trace": "openb default", "variant": "mig-frag (the cycle's engine)", "alloc@100 %": "92.51 ± 0.13",
         "invalid": 0, "decisions/s": 9104},
        {"trace": "openb default", "variant": "first-fit, repartitioning (baseline)", "alloc@100 %": "90.10 ± 0.20",
         "invalid": 0, "decisions/s": 12000},
        {"trace": "openb default", "variant": "milli model", "alloc@100 %": "", "invalid": "1.00 ± 0.00",
         "decisions/s": ""},
    ]  # fmt: skip
    assert mig.headline(mig_rows) == Headline(
        "openb default alloc@100 92.51 ± 0.13 %, 0 invalid, 9104 decisions/s", "first-fit 90.10 ± 0.20 %"
    )


def test_execution_reads_the_median_round_for_both_backends():
    rows = [
        {"backend": "slurm", "round": "1 (direct first)", "jobs_per_s": 29.0, "p50_s": 3.13, "ratio": 0.635},
        {"backend": "slurm", "round": "median", "jobs_per_s": 30.1, "p50_s": 3.03, "ratio": 0.61,
         "alone jobs_per_s": 49.3, "alone p50_s": 2.1},
    ]  # fmt: skip
    expected = Headline("slurm: 30.1 jobs/s, p50 3.03 s, ratio 0.61", "slurm alone 49.3 jobs/s, p50 2.1 s")
    assert execution.headline(rows) == execution_container.headline(rows) == expected


def test_scale_takes_its_largest_cycle_and_engine_point():
    rows = [
        {"what": "engine", "nodes": 1213, "decisions/s": 9000},
        {"what": "engine", "nodes": 12130, "decisions/s": 6354},
        {"what": "cycle", "nodes": 1213, "queued": 1000, "seconds": 0.4, "queries": 22},
        {"what": "cycle", "nodes": 12130, "queued": 100000, "seconds": 6.2, "queries": 27},
    ]
    assert scale.headline(rows).figure == (
        "cycle over 100,000 queued on 12,130 nodes 6.2 s, 27 queries; engine 6354 decisions/s at 12,130 nodes"
    )


def test_faults_count_every_bad_outcome_and_name_what_did_not_converge():
    clean = dict.fromkeys(faults.FAULT_COUNTS, 0)
    rows = [
        {"scenario": "controller_outage (60 s)", **clean, "converge_s": 5.6},
        {"scenario": "drain", **clean, "stuck": 1, "converge_s": None},
        {"scenario": "database_drop", **clean, "converge_s": 15.7},
    ]
    assert faults.headline(rows) == Headline(
        "1 lost/doubled/failed/stuck/cordoned/5xx over 3 scenarios; slowest to converge database_drop 15.7 s; "
        "not converged: drain"
    )


def test_an_absolute_target_says_it_has_no_baseline_and_the_line_names_its_own_command():
    rows = [{"run": "1 gateway process", "rps": 1151.6, "ratio": 0.296, "direct_rps": 3892.2}]
    line = _summary_line(gateway, rows, "2026-12-06")

    assert line["command"] == "`python -m bench.run gateway`"
    assert line["baseline (same run)"] == "the runtime direct 3892.2 req/s, haproxy - req/s"
    assert line["target"] == gateway.TARGET and line["date"] == "2026-12-06"
    assert faults.headline([{"scenario": "x", **dict.fromkeys(faults.FAULT_COUNTS, 0), "converge_s": 1}]).baseline == (
        NO_BASELINE
    )
    assert table([line]).splitlines()[0].startswith("| benchmark | command | today |")


def test_benchmarks_are_chosen_by_their_short_names():
    assert _chosen(["faults", "placement"]) == ["bench.faults", "bench.report.placement"]
    assert _chosen([]) == BENCHMARKS
    with pytest.raises(SystemExit, match="Unknown benchmarks: nope"):
        _chosen(["nope"])
