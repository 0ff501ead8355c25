"""The side-by-side of expected starts (bench/start_accuracy_slurm.py), small: the same four jobs on the real test
Slurm cluster and through the platform's cycle; each system's estimates against its own actual starts."""

import pytest

from bench.start_accuracy_slurm import Job, Observed, errors, on_platform, on_slurm

# Three 2-GPU jobs fill the 3 x 2 GPUs for 40 s of their 1-minute limit; the fourth (of another kind: a 2-minute
# limit) waits for the first to end.
SMALL = (Job("a", 2, 1, 40, 0), Job("b", 2, 1, 40, 0), Job("c", 2, 1, 40, 0), Job("d", 2, 2, 5, 0))


def test_errors_are_shares_of_each_jobs_wait():
    report = errors([Observed("a", 0.0, 0.0), Observed("b", 60.0, 40.0), Observed("c", None, 10.0)])
    assert (report["waited"], report["started_at_once"], report["unknown"]) == (2, 1, 1)
    assert report["median_error_share"] == 0.5  # said 60 s, started after 40 s
    assert report["jobs"]["b"] == {"waited_s": 40.0, "estimate_s": 60.0}


@pytest.mark.django_db
def test_the_platform_learns_early_ends_slurm_counts_on_limits(slurm, tmp_path):
    slurm_report = errors(on_slurm(slurm, SMALL, timeout_s=180))
    platform_report = errors(on_platform(SMALL, history=SMALL[:3], node_list=tmp_path / "nodes.csv"), scale_s=60)
    # Slurm shows "d" to start when a job reaches its limit (60 s after it started, a second or two after
    # submission), once its backfill pass has run; it started when the first job ended, about 40 s after.
    assert slurm_report["waited"] == 1
    assert slurm_report["jobs"]["d"]["estimate_s"] >= 60
    assert slurm_report["jobs"]["d"]["waited_s"] == pytest.approx(40, abs=10)
    # The platform, with a, b and c run before as history (jobs of their kind used 40/60 of their term), says 40 s
    # at submission.
    assert platform_report["jobs"]["d"] == {"waited_s": 40.0, "estimate_s": 40.0}
    assert platform_report["median_error_share"] == 0.0 < slurm_report["median_error_share"]
