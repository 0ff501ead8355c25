"""Multi-node gangs on the openb fleet x10 with a seeded rack/block tree, the platform beside Slurm's topology/tree
algorithm and topology-blind first fit on the same arrivals (bench/gang.py; one `python -m bench gang` process)."""

import json
import subprocess
import sys

from bench.gang import GANG_SHARE, GANG_SIZES, GANG_TOPOLOGY, RACK_SIZE, RACKS_PER_BLOCK, openb_dir
from bench.headline import Headline, row_where
from bench.report import ROOT, mean_std

TITLE = "Multi-node gangs (openb x10, rack/block tree)"
SEEDS = "42-44"
DESCRIPTION = (
    f"openb default pods (FGD protocol, inflate 1.3) with {GANG_SHARE:.0%} of arrivals multi-node gangs of 8 whole "
    f"cards per node, {'/'.join(str(size) for size, _ in GANG_SIZES)} nodes (weights "
    f"{'/'.join(str(weight) for _, weight in GANG_SIZES)}), "
    + ", ".join(f"{weight:.0%} {mode} {level}" for level, mode, weight in GANG_TOPOLOGY)
    + f"; {RACK_SIZE} nodes a rack, {RACKS_PER_BLOCK} racks a block, seeded. alloc@100: GPU capacity allocated when "
    "the arrived demand (gangs included) reaches capacity; violations: placed gangs outside their required domain; "
    "preferred in one rack: among preferred gangs one rack could hold at arrival. Baselines: Slurm topology/tree "
    "(lowest switch level with enough free nodes, best fit, leaves best fit, node order; pods best fit), "
    "topology-blind first fit (pods best fit), and the platform's pods with Slurm-tree gangs (ablation). Ceiling: "
    "the most any placement could allocate at arrived 100 %, chosen in hindsight (a maximum flow: cards pooled per "
    "rack and model, gangs only on nodes of their model that could hold a member, required gangs inside one domain "
    "with enough such nodes)."
)
TARGET = "0 violations; alloc@100 >= slurm-tree + 2 points; preferred in one rack >= slurm-tree; >= 1,000 decisions/s"


def run() -> list[dict]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "gang",
            "--scale",
            "10",
            "--seeds",
            SEEDS,
            "--data",
            str(openb_dir()),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return rows_of(json.loads(out))


CEILING = "ceiling: hindsight bound (bench/gang_bound.py)"


def rows_of(summary: dict) -> list[dict]:
    load = f"{summary['load_avg']['start']} -> {summary['load_avg']['end']}"
    ceiling = {
        "variant": CEILING,
        "nodes": summary["nodes"],
        "alloc@100 %": mean_std(summary["hindsight_bound"]),
        "violations": "-",
        "preferred in one rack %": "-",
        "gangs placed": "-",
        "decisions/s": "-",
        "load avg": load,
    }
    return [
        {
            "variant": name,
            "nodes": summary["nodes"],
            "alloc@100 %": mean_std(row["alloc_at_100"]),
            "violations": row["violations"],
            "preferred in one rack %": mean_std(row["preferred_in_one_rack"]),
            "gangs placed": f"{row['gangs_placed']}/{row['gangs']}",
            "decisions/s": row["decisions_per_s"],
            "load avg": load,
        }
        for name, row in summary["variants"].items()
    ] + [ceiling]


def headline(rows: list[dict]) -> Headline:
    ours, slurm = row_where(rows, variant="platform"), row_where(rows, variant="slurm-tree")
    return Headline(
        f"platform alloc@100 {ours['alloc@100 %']} %, {ours['violations']} violations, preferred in one rack "
        f"{ours['preferred in one rack %']} %, {ours['decisions/s']} decisions/s",
        f"slurm-tree {slurm['alloc@100 %']} %, preferred in one rack {slurm['preferred in one rack %']} %; "
        f"ceiling (hindsight bound) {row_where(rows, variant=CEILING)['alloc@100 %']} %",
    )
