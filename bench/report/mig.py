"""MIG as the hardware does it, on the openb default, gpushare100 and gpuspec33 traces (read from
../shared/data/openb, never copied): the engine the cycle runs (fragmentation score, repartitioning, partition
budget), without the budget, first-fit over valid placements, and on default the static layouts, the milli-share
model and the ceilings. One `python -m bench.placement mig --json` process."""

from pathlib import Path

from bench.headline import Headline, row_where
from bench.report import mean_std, placement_report

ROOT = Path(__file__).resolve().parents[2]
OPENB = ROOT.parent / "shared" / "data" / "openb"
SEEDS = "42-51"
TITLE = "MIG placement (openb traces mapped to MIG, arrivals only, inflate 1.3)"
DESCRIPTION = (
    "openb's G2 nodes taken as H100 80GB and G3 as A100 80GB (4,704 MIG-capable cards, 7 compute / 8 memory "
    "slices, NVIDIA's placements), T4/P100/V100/A10 as whole cards; a fractional pod asks for the smallest profile "
    "whose compute (g/7) and memory (slices/8) fractions cover its share (openb default: 0.05-0.11 -> 1g.10gb, "
    "0.14 -> 1g.20gb, 0.16-0.23 -> 2g.20gb, 0.27-0.37 -> 3g.40gb, 0.44-0.48 -> 4g.40gb, 0.55-0.81 -> 7g.80gb), "
    "whole pods ask for whole cards; a pod's GPU-model constraint (gpuspec33) is honoured (`off constraint` counts "
    "bindings on a model it does not allow: 0), a fractional pod that allows no G2/G3 model is a time-sliced share "
    "of the cards it names. `mig-frag` is what the cycle runs: the MIG fragmentation score with model pressure, "
    "repartitioning and the partition budget from the demand mix seen so far (scheduling/mig/budget.py). alloc@100 "
    "counts the pods' requested GPU share at arrived 100% for every variant. decisions/s is CPU time of the process "
    "(one core; pending reasons included). `invalid` counts final layouts that break a placement rule (every layout "
    f"is checked). Seeds {SEEDS}. `milli model`: the milli-share engine with a slice as a milli-share (1g = 142), "
    "its final per-card slice sets checked for any valid layout (mean per seed). Ceilings "
    "(`bench.mig.ceilings`, CPU, memory and node boundaries ignored, all cards pooled): every pod placed "
    "in arrival order while the pool has room (perfect packing; an engine that makes work wait, as the budget "
    "does, can pass it), and the LP bound of the best subset in hindsight (a true bound)."
)
TARGET = "above first-fit on every trace; 0 invalid layouts, 0 off constraint"
COLUMNS = ("trace", "variant", "alloc@100 %", "accepted slices", "invalid", "off constraint", "decisions/s", "load avg")


def _row(**values) -> dict:
    return {column: values.get(column, "") for column in COLUMNS}


def headline(rows: list[dict]) -> Headline:
    ours = row_where(rows, trace="openb default", variant="mig-frag (the cycle's engine)")
    first_fit = row_where(rows, trace="openb default", variant="first-fit, repartitioning (baseline)")
    invalid = sum(int(row["invalid"]) for row in rows if isinstance(row["invalid"], int))
    return Headline(
        f"openb default alloc@100 {ours['alloc@100 %']} %, {invalid} invalid, {ours['decisions/s']} decisions/s",
        f"first-fit {first_fit['alloc@100 %']} %",
    )


def run() -> list[dict]:
    if not OPENB.is_dir():
        return [_row(trace="openb traces not found")]
    summary = placement_report("mig", "--data", str(OPENB), "--seeds", SEEDS)
    load = f"{summary['load_avg']['start']} -> {summary['load_avg']['end']}"

    rows = []
    for trace, result in summary["traces"].items():
        variants = [
            ("mig-frag (the cycle's engine)", result),
            ("without the partition budget", result["without_budget"]),
            ("first-fit, repartitioning (baseline)", result["baseline"]),
        ]
        if "no_repartitioning" in result:
            variants.append(("frag, no repartitioning (static layouts)", result["no_repartitioning"]))
        for label, part in variants:
            rows.append(
                _row(
                    trace=trace,
                    variant=label,
                    **{
                        "alloc@100 %": mean_std(part["alloc_at_100"]),
                        "accepted slices": f"{mean_std(part['accepted_slice_demands'])} of "
                        f"{part['slice_demands']['mean']:.1f}",
                        "invalid": part["invalid_layouts"],
                        "off constraint": part["off_constraint"],
                        "decisions/s": part["decisions_per_s"],
                        "load avg": load,
                    },
                )
            )
        if "milli_model_invalid_layouts" in result:
            rows.append(
                _row(trace=trace, variant="milli model", invalid=mean_std(result["milli_model_invalid_layouts"]))
            )
    for label, key in (
        ("ceiling: perfect packing, arrival order", "perfect_packing"),
        ("ceiling: hindsight LP bound (refuses work that fits)", "hindsight_bound"),
    ):
        rows.append(_row(trace="openb default", variant=label, **{"alloc@100 %": mean_std(summary[key])}))
    return rows
