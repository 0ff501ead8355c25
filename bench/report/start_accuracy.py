"""How accurate expected starts are (issue 35): the steady replay's estimates against the actual starts, and the side
by side with Slurm's own estimate (`squeue --start`) on one small fixed workload on the real test cluster."""

from bench.headline import Headline
from bench.report.scale import bench_on_fresh_database, bench_scheduler_on_fresh_database

TITLE = "Expected starts: accuracy (steady replay; side by side with Slurm)"
STEADY = ("--scale", "1", "--requests", "8000", "--steady", "20", "--arrivals", "60", "--warmup", "5")
DESCRIPTION = (
    f"Steady replay: `python -m bench scheduler {' '.join(STEADY)}` (1,213 openb nodes, 8,000 trace requests queued "
    "at t = 0, then Poisson(60) a simulated minute, a cycle a minute): each request's likely start as the first cycle "
    "after its submission stored it against the cycle that placed it; the error is |estimate - start| as a share of "
    "the wait, for the requests that waited and had a time (bench/start_accuracy.py). Requests submitted in the first "
    "5 minutes are the `warmup` row: nothing has ended yet, so the forecast has no history of early ends and takes "
    "all work to its limit. `unknown` counts requests that waited with no time (the code says why). Side by side: "
    "`python -m bench start_accuracy_slurm` (bench/start_accuracy_slurm.py): 24 jobs of five kinds (1 or 2 GPUs, "
    "limits of 1-3 minutes) that end at 21-92 % of their limit at recorded times, eight at once then one every "
    "10 s, on the real test Slurm cluster (3 nodes x 2 GPUs, about five minutes; the estimate is the first "
    "StartTime `squeue --start` shows while the job pends) and through the platform's cycle on a fleet of the same "
    "shape (simulated time, a minute of limit an hour of term; nine other runs of four of the kinds before as "
    "history, the fifth kind new). Saturated at 10x, by hand (about 13 minutes): `python -m bench scheduler "
    "--scale 10 --requests 60000 --steady 6 --arrivals 1000 --warmup 2` (docs/benchmarks/history.md)."
)
TARGET = "median <= 0.25, p90 <= 0.60 of the actual wait; better than Slurm's squeue --start on the same workload"


def headline(rows: list[dict]) -> Headline:
    by_what = {row["what"]: row for row in rows}
    steady, platform, slurm = by_what["steady replay"], by_what["platform"], by_what["slurm squeue --start"]
    return Headline(
        f"steady: median {steady['median']}, p90 {steady['p90']} ({steady['waited']} waited); side by side: "
        f"median {platform['median']}, p90 {platform['p90']}",
        f"Slurm squeue --start: median {slurm['median']}, p90 {slurm['p90']}",
    )


def run() -> list[dict]:
    load, report, load_after = bench_scheduler_on_fresh_database(*STEADY)
    accuracy = report["expected_start_accuracy"]
    rows = [
        _row("steady replay", accuracy, f"{load} - {load_after}"),
        _row("steady replay, warm-up", accuracy["warmup"], f"{load} - {load_after}"),
    ]
    load, side_by_side, load_after = bench_on_fresh_database("start_accuracy_slurm")
    rows += [
        _side_row("platform", side_by_side["platform"], f"{load} - {load_after}"),
        _side_row("slurm squeue --start", side_by_side["slurm"], f"{load} - {load_after}"),
    ]
    return rows


def _row(what: str, figures: dict, load: str) -> dict:
    return {
        "what": what,
        "waited": figures["started_after_a_wait"],
        "at once": figures["started_at_once"],
        "unknown": sum(figures["untimed_after_a_wait"].values()),
        "median": figures["median_error_share"],
        "p90": figures["p90_error_share"],
        "by wait (n: median / p90)": _buckets(figures.get("by_wait", {})),
        "load": load,
    }


def _side_row(what: str, figures: dict, load: str) -> dict:
    return {
        "what": what,
        "waited": figures["waited"],
        "at once": figures["started_at_once"],
        "unknown": figures["unknown"],
        "median": figures["median_error_share"],
        "p90": figures["p90_error_share"],
        "by wait (n: median / p90)": "-",
        "load": load,
    }


def _buckets(by_wait: dict) -> str:
    return (
        "; ".join(
            f"{name} {bucket['n']}: {bucket['median_error_share']} / {bucket['p90_error_share']}"
            for name, bucket in by_wait.items()
            if bucket["n"]
        )
        or "-"
    )
