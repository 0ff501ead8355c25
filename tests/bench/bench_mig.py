"""MIG as the hardware does it, on the openb default trace (read from ../shared/data/openb, never copied): the
geometry-true engine with and without repartitioning, first-fit over valid placements, and how many layouts the
milli-share model makes that no card could hold. One `python -m scheduling.bench mig` process."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPENB = ROOT.parent / "shared" / "data" / "openb"
SEEDS = "42-51"
TITLE = "MIG placement (openb default mapped to MIG, arrivals only, inflate 1.3)"
DESCRIPTION = (
    "openb's G2 nodes taken as H100 80GB and G3 as A100 80GB (4,704 MIG-capable cards, 7 compute / 8 memory "
    "slices, NVIDIA's placements), T4/P100/V100/A10 as whole cards; a fractional pod asks for the smallest profile "
    "whose compute (g/7) and memory (slices/8) fractions cover its share (openb default: 0.05-0.11 -> 1g.10gb, "
    "0.14 -> 1g.20gb, 0.16-0.23 -> 2g.20gb, 0.27-0.37 -> 3g.40gb, 0.44-0.48 -> 4g.40gb, 0.55-0.81 -> 7g.80gb), "
    "whole pods ask for whole cards. "
    "alloc@100 counts the pods' requested GPU share at arrived 100% for every variant. decisions/s is CPU time of "
    "the process (one core; pending reasons included). `invalid` counts final layouts that break a placement "
    f"rule (every layout is checked). Seeds {SEEDS}. `milli model`: the current engine with a slice as a milli-share "
    "(1g = 142), its final per-card slice sets checked for any valid layout (mean per seed). Ceilings "
    "(`scheduling.mig_bench.ceilings`, CPU, memory and node boundaries ignored, all cards pooled): every pod placed "
    "in arrival order while the pool has room (perfect packing), and the LP bound of the best subset in hindsight."
)


def run() -> list[dict]:
    if not OPENB.is_dir():
        return [
            {
                "variant": "openb trace not found",
                "alloc@100 %": "",
                "accepted slices": "",
                "invalid": "",
                "decisions/s": "",
                "load avg": "",
            }
        ]
    load = os.getloadavg()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduling.bench",
            "mig",
            "--nodes",
            str(OPENB / "openb_node_list_gpu_node.csv"),
            "--pods",
            str(OPENB / "openb_pod_list_default.csv"),
            "--seeds",
            SEEDS,
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    summary = json.loads(out)
    load = f"{load[0]:.1f} -> {os.getloadavg()[0]:.1f}"

    def fmt(stat):
        return "n/a" if stat["mean"] is None else f"{stat['mean']:.2f} ± {stat['std']:.2f}"

    rows = []
    for label, part in (
        ("frag, repartitioning", summary),
        ("frag, no repartitioning (static layouts)", summary["no_repartitioning"]),
        ("first-fit, repartitioning (baseline)", summary["baseline"]),
    ):
        rows.append(
            {
                "variant": label,
                "alloc@100 %": fmt(part["alloc_at_100"]),
                "accepted slices": f"{fmt(part['accepted_slice_demands'])} of {part['slice_demands']['mean']:.1f}",
                "invalid": part["invalid_layouts"],
                "decisions/s": part["decisions_per_s"],
                "load avg": load,
            }
        )
    rows.append(
        {
            "variant": "milli model (today)",
            "alloc@100 %": "",
            "accepted slices": "",
            "invalid": fmt(summary["milli_model_invalid_layouts"]),
            "decisions/s": "",
            "load avg": load,
        }
    )
    for label, key in (
        ("ceiling: perfect packing, arrival order", "ceiling_perfect_packing"),
        ("ceiling: hindsight LP (refuses work that fits)", "ceiling_hindsight"),
    ):
        rows.append(
            {
                "variant": label,
                "alloc@100 %": fmt(summary[key]),
                "accepted slices": "",
                "invalid": "",
                "decisions/s": "",
                "load avg": "",
            }
        )
    return rows
