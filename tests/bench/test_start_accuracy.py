"""The steady-state replay's accuracy of expected starts (bench/start_accuracy.py): the error as a share of the
actual wait, per wait bucket, the warm-up apart."""

from datetime import UTC, datetime

from bench.start_accuracy import StartAccuracy


def test_errors_are_shares_of_the_actual_wait_per_bucket():
    accuracy = StartAccuracy(datetime(2026, 12, 1, tzinfo=UTC), interval_s=60.0)
    accuracy.likely = {1: 600.0, 2: 3000.0, 3: None, 4: 0.0, 5: 30.0}  # simulated seconds; 3 had no time
    accuracy.untimed = {3: "beyond_forecast"}
    accuracy.note_start(1, arrived=0.0, started=1200.0)  # waited 20 min, said 10: half the wait off
    accuracy.note_start(2, arrived=0.0, started=3600.0)  # waited 1 h, said 50 min: a sixth off
    accuracy.note_start(3, arrived=0.0, started=600.0)  # no time: not measured
    accuracy.note_start(4, arrived=0.0, started=0.0)  # placed at once
    accuracy.note_start(5, arrived=0.0, started=60.0)  # said 30 s: capacity frees then, the next cycle is at 60 s
    report = accuracy.report()
    assert report["by_wait"]["<5 min"] == {"n": 1, "median_error_share": 0.0, "p90_error_share": 0.0}
    assert report["by_wait"]["5-30 min"] == {"n": 1, "median_error_share": 0.5, "p90_error_share": 0.5}
    assert report["by_wait"]["30 min-2 h"]["median_error_share"] == 0.167
    assert (report["started_after_a_wait"], report["started_at_once"]) == (3, 1)
    assert report["raw_p90_error_share"] == 0.5  # 30 s off a 60 s wait without the grid
    assert report["untimed_after_a_wait"] == {"beyond_forecast": 1}


def test_requests_submitted_in_the_warm_up_are_reported_apart():
    accuracy = StartAccuracy(datetime(2026, 12, 1, tzinfo=UTC), interval_s=60.0, warmup_s=300.0)
    accuracy.likely = {1: 3600.0, 2: 420.0}
    accuracy.note_start(1, arrived=0.0, started=180.0)  # no history yet: said its neighbours' limit, an hour
    accuracy.note_start(2, arrived=360.0, started=420.0)
    report = accuracy.report()
    assert (report["started_after_a_wait"], report["median_error_share"]) == (1, 0.0)
    assert (report["warmup"]["started_after_a_wait"], report["warmup"]["median_error_share"]) == (1, 19.0)
