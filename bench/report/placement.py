"""Placement engine on the FGD paper's protocol: a synthetic cluster generated here, and the Alibaba openb traces
when ../shared/data/openb exists (never copied into the project). Each row is one `python -m bench.placement`
process, so peak memory is per run."""

import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.headline import Headline, row_where
from bench.report import mean_std, placement_report

ROOT = Path(__file__).resolve().parents[2]
OPENB = ROOT.parent / "shared" / "data" / "openb"
TITLE = "Placement engine (FGD protocol, arrivals only, inflate 1.3)"
SEEDS, FEW_SEEDS = "42-51", "42-44"
DESCRIPTION = (
    "Mean ± std over seeds of the share of GPU capacity allocated when the arrived GPU demand reaches 100% and "
    "130% of capacity, the expected stranded GPU capacity at 100%, placement decisions per second (one core, "
    "pending reasons included) and peak RSS of the run. `fgd`, `bestfit` "
    "and `random` follow the FGD paper's simulator (published alloc@100 on openb default: FGD 95.23, BestFit "
    f"92.86, Random 86.30; gpuspec33: FGD 87.84, BestFit 80.40; multigpu50: FGD 97.09, BestFit 95.62). Seeds "
    f"{SEEDS}, except `random` on {FEW_SEEDS} (it scans nodes in random order, the slowest baseline). The "
    "production default is `fgd-plus` (FGD behind a per-model pressure routing learnt from the workload's shapes): "
    "it ties `fgd` on default and multigpu50 and gains about 6 points on gpuspec33; `fgd-pack` gains 0.1 point "
    "on default and multigpu50 but loses on gpuspec33. The issue's 96.0% target on default is not reached (see "
    "the analysis in the issue's closing note)."
)
TARGET = "fgd-plus >= fgd on every openb trace (96.0 % on default: not reached)"
POLICIES = ["fgd-plus", "fgd-pack", "fgd", "bestfit", "random"]


def synthetic(directory: Path) -> tuple[str, str]:
    """A deterministic 300-node heterogeneous cluster and a 3,000-pod workload with shared, whole and multi-GPU."""
    rng = random.Random(2024)
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    kinds = [
        (96000, 393216, 8, "A100"),
        (64000, 262144, 4, "T4"),
        (32000, 131072, 2, "V100"),
        (128000, 786432, 8, "H100"),
    ]
    for n in range(300):
        cpu, mem, gpus, model = kinds[rng.choices(range(4), weights=[4, 3, 2, 1])[0]]
        nodes.append(f"syn-node-{n:04d},{cpu},{mem},{gpus},{model}")
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    for n in range(3000):
        kind = rng.random()
        if kind < 0.12:
            num, milli = 0, 0
        elif kind < 0.5:
            num, milli = 1, rng.choice([200, 250, 300, 470, 500, 650, 810])
        elif kind < 0.9:
            num, milli = 1, 1000
        else:
            num, milli = rng.choice([2, 4, 8]), 1000
        spec = rng.choice(["", "", "", "A100", "T4|V100", "H100"])
        pods.append(
            f"syn-pod-{n:05d},{rng.choice([2000, 4000, 6000, 8000, 12000])},"
            f"{rng.choice([8192, 16384, 32768, 65536])},{num},{milli},{spec}"
        )
    (directory / "nodes.csv").write_text("\n".join(nodes) + "\n")
    (directory / "pods.csv").write_text("\n".join(pods) + "\n")
    return str(directory / "nodes.csv"), str(directory / "pods.csv")


def _one(trace: str, nodes: str, pods: str, policy: str) -> dict:
    seeds = FEW_SEEDS if policy == "random" else SEEDS
    summary = placement_report(
        "openb", "--nodes", nodes, "--pods", pods, "--policy", policy, "--seeds", seeds, "--inflate", "1.3"
    )
    return {
        "trace": trace,
        "policy": policy,
        "seeds": seeds,
        "alloc@100 %": mean_std(summary["alloc_at_100"]),
        "alloc@130 %": mean_std(summary["alloc_at_130"]),
        "frag@100 %": mean_std(summary["frag_at_100"]),
        "decisions/s": summary["decisions_per_s"],
        "peak MB": summary["peak_mem_mb"],
    }


def headline(rows: list[dict]) -> Headline:
    trace = "openb default" if any(row["trace"] == "openb default" for row in rows) else "synthetic"
    ours = row_where(rows, trace=trace, policy="fgd-plus")
    fgd, best_fit = row_where(rows, trace=trace, policy="fgd"), row_where(rows, trace=trace, policy="bestfit")
    return Headline(
        f"{trace}: fgd-plus alloc@100 {ours['alloc@100 %']} %, {ours['decisions/s']} decisions/s",
        f"fgd {fgd['alloc@100 %']} %, best-fit {best_fit['alloc@100 %']} %",
    )


def run() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [("synthetic", *synthetic(Path(tmp)), policy) for policy in POLICIES]
        if OPENB.is_dir():
            node_list = str(OPENB / "openb_node_list_gpu_node.csv")
            for trace in ("default", "gpuspec33", "multigpu50"):
                jobs += [
                    (f"openb {trace}", node_list, str(OPENB / f"openb_pod_list_{trace}.csv"), policy)
                    for policy in POLICIES
                ]
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(lambda job: _one(*job), jobs))
