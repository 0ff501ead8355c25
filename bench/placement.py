"""The placement benchmarks on the Alibaba openb traces: the engine on the FGD paper's protocol (bench/traces.py) and
MIG as the hardware does it (bench/mig.py).

    python -m bench.placement openb --nodes NODES.csv --pods PODS.csv --policy NAME --seeds 42-51 --inflate 1.3
    python -m bench.placement openb ... --scale 10     (the node list 10 times: 12,130 nodes, 62,120 GPUs)
    python -m bench.placement mig --seeds 42-51 --json     (bench.mig: openb default, gpushare100 and
        gpuspec33 from --data, default $OPENB_DIR or ../shared/data/openb; --nodes/--pods for one trace)
"""

import argparse
import json
import sys
from pathlib import Path

from bench import mig as mig_bench
from bench import traces


def fmt(stat: dict) -> str:
    return "n/a" if stat["mean"] is None else f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def _mig_text(summary: dict) -> str:
    if "traces" not in summary:
        return _mig_trace_text("trace", summary)
    lines = [_mig_trace_text(name, trace) for name, trace in summary["traces"].items()]
    lines.append(
        f"ceilings on openb default: {fmt(summary['perfect_packing'])}% (perfect packing), "
        f"{fmt(summary['hindsight_bound'])}% (hindsight LP bound)  load avg {summary['load_avg']['start']} -> "
        f"{summary['load_avg']['end']}"
    )
    lines += [f"target {name}: {target}" for name, target in summary["targets"].items()]
    return "\n".join(lines)


def _mig_trace_text(name: str, summary: dict) -> str:
    baseline, without = summary["baseline"], summary["without_budget"]
    return (
        f"{name}: mig-frag alloc@100 {fmt(summary['alloc_at_100'])}% ({summary['decisions_per_s']}/s, "
        f"{summary['invalid_layouts']} invalid, {summary['off_constraint']} off constraint)  without the partition "
        f"budget {fmt(without['alloc_at_100'])}%  first-fit {fmt(baseline['alloc_at_100'])}%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", choices=["openb", "mig"])
    parser.add_argument("--nodes", help="The node list (openb: required; mig: with --pods, one trace).")
    parser.add_argument("--pods", help="The pod list (openb: required; mig: one trace instead of the three).")
    parser.add_argument("--data", help="mig: the openb trace directory (default $OPENB_DIR or ../shared/data/openb).")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--inflate", type=float, default=1.3)
    parser.add_argument("--scale", type=int, default=1, help="Replicate the node list K times (distinct names).")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.trace == "mig":
        seeds = traces.parse_seeds(args.seeds)
        if args.pods:
            nodes = args.nodes or str(Path(args.data or mig_bench.openb_dir()) / mig_bench.NODES)
            summary = mig_bench.run(nodes, args.pods, seeds, args.inflate)
        else:
            summary = mig_bench.run_all(Path(args.data or mig_bench.openb_dir()), seeds, args.inflate)
        print(json.dumps(summary) if args.json else _mig_text(summary))
        return 0
    if not (args.nodes and args.pods):
        parser.error("openb needs --nodes and --pods")
    summary = traces.run(args.nodes, args.pods, args.policy, traces.parse_seeds(args.seeds), args.inflate, args.scale)
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['nodes']} nodes  policy {summary['policy']}  seeds {args.seeds}  "
            f"alloc@100 {fmt(summary['alloc_at_100'])}%  "
            f"alloc@{round(100 * args.inflate)} {fmt(summary['alloc_at_130'])}%  "
            f"frag@100 {fmt(summary['frag_at_100'])}%  {summary['decisions_per_s']} decisions/s "
            f"({summary['decisions_per_cpu_s']} per CPU second)  "
            f"peak {summary['peak_mem_mb']} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
