"""Where gangs land on the real test Slurm cluster: one small fixed sequence through Slurm itself and through the
platform (bench/gang_replay.py; one `python -m bench gang_replay` process on a fresh scratch database)."""

from bench.gang_replay import LEAF_SWITCHES, NODES, SEQUENCE, SETTLED_S, rows
from bench.headline import Headline
from bench.report.scale import bench_on_fresh_database

TITLE = "Multi-node gangs on the real Slurm cluster: one sequence through Slurm and through the platform"
DESCRIPTION = (
    f"`python -m bench gang_replay` (bench/gang_replay.py): the test Slurm cluster with {NODES} `slurmd -N` nodes "
    f"of gpu:a100:2 under {LEAF_SWITCHES} leaf switches (topology/tree; scheduler tuned, backfill every second), "
    f"{len(SEQUENCE)} jobs (single nodes, 2- and 3-node gangs, rack required or preferred) arriving in order at "
    "fixed steps, some ending at recorded steps (cancelled or released: work that ended early; a time limit of ten "
    "times its end step, minutes in Slurm, hours of term on the platform). Slurm: each job an `sbatch -N <nodes> "
    "--gres=gpu:a100:<cards>` per node, `--switches=1` when the rack is required. The platform: the same jobs as "
    "orders of multi-node specs into the scheduling cycle (nodes and racks imported from Slurm and its "
    "topology.conf), provisioned as one Slurm job each, pinned to the nodes it chose; tasks inline. After each "
    f"event both settle (Slurm: squeue unchanged for {SETTLED_S} s). Each row: an event; for an arrival where each "
    "system ran the job (its Slurm job's NodeList, with the leaf switches; `waits; step k` when it started later), "
    "and after the event each system's running/waiting jobs. Totals: gangs kept in one switch, required-rack "
    "violations, the waiting counts summed over the events, the jobs that never ran, and whether the platform's "
    "books named its jobs' NodeLists at every event."
)
TARGET = "tracked: every gang where each system put it; 0 required-rack violations on both"


def run() -> list[dict]:
    load, report, load_after = bench_on_fresh_database("gang_replay", "--json")
    return report_rows(report, f"{load} -> {load_after}")


def report_rows(report: dict, load: str) -> list[dict]:
    """The replay's rows (bench.gang_replay.rows), then each system's totals."""
    return [
        *rows(report),
        {
            "step": "total",
            "event": f"{report['seconds']} s, load {load}",
            "slurm: nodes (switch)": _totals_text(report["totals"]["slurm"]),
            "platform: nodes (switch)": _totals_text(report["totals"]["platform"]) + _books(report["books_disagree"]),
            "slurm run/wait": "-",
            "platform run/wait": "-",
        },
    ]


def _totals_text(figures: dict) -> str:
    never = f", never ran: {', '.join(figures['never_started'])}" if figures["never_started"] else ""
    return (
        f"{figures['gangs_in_one_switch']}/{figures['gangs_ran']} gangs in one switch, "
        f"{figures['required_violations']} required-rack violations, {figures['waiting_after_events']} "
        f"job-events waiting{never}"
    )


def _books(disagree: list[str]) -> str:
    """Whether the platform's books named the nodes of its Slurm jobs' NodeLists at every event."""
    return f"; books differ from Slurm for {', '.join(disagree)}" if disagree else "; books = Slurm's NodeLists"


def headline(rows: list[dict]) -> Headline:
    total = rows[-1]
    return Headline(f"platform: {total['platform: nodes (switch)']}", f"Slurm: {total['slurm: nodes (switch)']}")
