"""python -m bench gang [--scale 10] [--seeds 42-44] [--max-arrivals N] [--json]

Multi-node gangs on the openb fleet: the openb node list --scale times (12,130 nodes at 10), read from --data
(default $OPENB_DIR or ../shared/data/openb, never copied), put in a seeded rack/block tree: the nodes shuffled with
the seed, 16 nodes a rack, 8 racks a block, one site. Arrivals: the openb default pods in the FGD protocol's seeded
order (bench/traces.py, inflate 1.3) with multi-node gangs mixed in, seeded, so that 10 % of arrivals are gangs:
2/4/8/16 nodes of 8 whole cards each (weights 0.5/0.3/0.15/0.05), 32 cores and 128 GiB per node, of one model drawn
by its count of 8-card nodes; 20 % `required` rack, 10 % `required` block, the rest `preferred` rack. Each arrival is
tried once (arrivals only, as the FGD protocol).

Variants, all in the same run on the same arrivals:
- `platform`: the engine as the cycle runs it: single pods by the default policy (fgd-plus), gangs by the gang
  placer (domain best fit, fewest stranded cards, preferred spill; scheduling/engine/gang.py);
- `slurm-tree`: Slurm's topology/tree plugin as its documentation describes it: the lowest switch level with a
  switch that has enough free nodes (capped at the required level), the best-fit switch there (fewest free nodes),
  then leaf switches best fit (the smallest leaf that holds what is left, else the fullest one) and nodes in node
  order within a leaf; single pods best fit (Slurm's select/cons_tres packs, the engine's `bestfit` policy);
- `first-fit`: topology-blind: a gang takes the first free nodes in node order wherever they are (required domains
  ignored: its violations are counted); single pods best fit;
- `platform pods + slurm-tree gangs`: an ablation, to tell the gang placer's share of the difference from the pod
  policy's.

Reported per variant (mean ± std over seeds where it varies): alloc% at 100 % arrival (GPU milli allocated over
capacity when the arrived GPU demand, gangs included, reaches capacity), required-domain violations, the share of
`preferred` gangs kept in one rack among those one rack could hold at arrival, gangs placed, and decisions/s (all
arrivals, pods and gangs; reasons for the ones that wait included, the preferred-rack check excluded). Beside them,
the ceiling: the hindsight bound of alloc@100 over the same arrivals (bench/gang_bound.py), the most any placement
keeping the required domains could reach, per seed and as mean ± std.
"""

from __future__ import annotations

import json as json_module
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from django.core.management.base import BaseCommand

from bench import traces
from bench.fleet import scaled_engine_nodes
from bench.gang_bound import hindsight_bound
from scheduling.engine import Binding, Demand, NodeView, PlacementEngine, Snapshot, workload_source
from scheduling.engine.frag import MILLI
from scheduling.engine.gang import FLEET, LEVELS, PREFERRED, RACK, REQUIRED, level_used
from scheduling.engine.policies import make_policy

RACK_SIZE, RACKS_PER_BLOCK = 16, 8
GANG_SHARE = 0.10  # of all arrivals
GANG_SIZES = ((2, 0.5), (4, 0.3), (8, 0.15), (16, 0.05))
GANG_TOPOLOGY = ((RACK, REQUIRED, 0.2), ("block", REQUIRED, 0.1), (RACK, PREFERRED, 0.7))
CARDS_PER_MEMBER, MEMBER_CPU, MEMBER_MEMORY = 8, 32_000, 128 * 1024
MEMBER = Demand("member", count=CARDS_PER_MEMBER, cpu_milli=MEMBER_CPU, memory_mib=MEMBER_MEMORY)  # any model
NODES_FILE, PODS_FILE = "openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"
TARGETS = {
    "violations": "0 required-domain violations",
    "alloc": "alloc@100 >= slurm-tree + 2 points",
    "preferred": "preferred gangs in one rack >= slurm-tree",
    "speed": ">= 1,000 decisions/s at 12,130 nodes",
}


def openb_dir() -> Path:
    return Path(os.environ.get("OPENB_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data" / "openb")


def topology_tree(nodes: list[NodeView], seed: int) -> list[NodeView]:
    """The nodes filed into racks of RACK_SIZE and blocks of RACKS_PER_BLOCK racks, in a seeded order."""
    order = list(range(len(nodes)))
    random.Random(seed).shuffle(order)
    placed = list(nodes)
    for position, i in enumerate(order):
        rack = position // RACK_SIZE
        placed[i] = replace(nodes[i], site="openb", block=f"b{rack // RACKS_PER_BLOCK:03d}", rack=f"r{rack:04d}")
    return placed


def arrivals(nodes: list[NodeView], pods: list[traces.Pod], seed: int, inflate: float) -> list[Demand]:
    """The FGD protocol's pod sequence with the seeded gangs mixed in (module docstring)."""
    capacity = sum(len(node.devices) for node in nodes) * MILLI
    eight_card = [node.devices[0].model for node in nodes if len(node.devices) >= CARDS_PER_MEMBER]
    models = sorted(set(eight_card))
    weights = [eight_card.count(model) for model in models]
    rng = random.Random(seed + 7)
    out = []
    for n, pod in enumerate(traces.workload(pods, capacity, seed, inflate)):
        if rng.random() < GANG_SHARE / (1 - GANG_SHARE):  # one gang per nine pods on average: 10 % of arrivals
            size = rng.choices([s for s, _ in GANG_SIZES], [w for _, w in GANG_SIZES])[0]
            level, mode = rng.choices([(lv, md) for lv, md, _ in GANG_TOPOLOGY], [w for *_, w in GANG_TOPOLOGY])[0]
            model = rng.choices(models, weights)[0]
            out.append(
                Demand(
                    f"gang-{n}",
                    count=CARDS_PER_MEMBER,
                    models=frozenset({model}),
                    cpu_milli=MEMBER_CPU,
                    memory_mib=MEMBER_MEMORY,
                    nodes=size,
                    level=level,
                    mode=mode,
                )
            )
        out.append(traces.demand_of(pod, n))
    return out


# -- gang algorithms: (engine, demand) -> bindings, or None when it waits -------------------------------------------


def platform_gang(engine: PlacementEngine, demand: Demand) -> list[Binding] | None:
    placed = engine.place_one(demand)
    return placed if isinstance(placed, list) else None


def slurm_tree_gang(engine: PlacementEngine, demand: Demand) -> list[Binding] | None:
    """Slurm's topology/tree (module docstring), over the same free-node counts the platform sees."""
    index = engine.gangs.index(demand)
    top = LEVELS.index(demand.level) if demand.mode == REQUIRED else LEVELS.index(FLEET)
    for level in LEVELS[: top + 1]:
        switches = [(len(free), path) for path, free in index.members[level].items() if len(free) >= demand.nodes]
        if switches:
            leaves: dict[str, list[int]] = {}
            for i in index.members[level][min(switches)[1]]:
                leaves.setdefault(engine.topology.paths[i][RACK], []).append(i)
            return engine.gangs.bind(demand, _leaves_best_fit(list(leaves.values()), demand.nodes))
    return None


def _leaves_best_fit(leaves: list[list[int]], wanted: int) -> list[int]:
    chosen: list[int] = []
    while len(chosen) < wanted:
        left = wanted - len(chosen)
        holding = [leaf for leaf in leaves if len(leaf) >= left]
        leaf = min(holding, key=len) if holding else max(leaves, key=len)
        leaves.remove(leaf)
        chosen += sorted(leaf)[:left]
    return chosen


def first_fit_gang(engine: PlacementEngine, demand: Demand) -> list[Binding] | None:
    """Topology-blind: the first free nodes in node order."""
    index = engine.gangs.index(demand)
    free = [i for i, spare in enumerate(index.spare) if spare is not None][: demand.nodes]
    return engine.gangs.bind(demand, free) if len(free) == demand.nodes else None


VARIANTS: dict[str, tuple[str, Callable]] = {
    "platform": ("default", platform_gang),
    "slurm-tree": ("bestfit", slurm_tree_gang),
    "first-fit": ("bestfit", first_fit_gang),
    "platform pods + slurm-tree gangs": ("default", slurm_tree_gang),
}


def simulate(nodes: list[NodeView], demands: list[Demand], variant: str, seed: int) -> dict:
    policy, place_gang = VARIANTS[variant]
    capacity = sum(len(node.devices) for node in nodes) * MILLI
    # The policy learns the workload's shapes as the cycle's does: from the demands, a gang as its members.
    engine = PlacementEngine(Snapshot(nodes), make_policy(policy, workload_source(demands)), seed=seed)
    arrived = allocated = 0
    by_arrived: dict[int, list[float]] = {}
    gangs = placed = violations = preferred = kept = 0
    elapsed = 0.0
    for demand in demands:
        milli = demand.count * demand.share * demand.nodes
        rack_holds = (
            demand.nodes > 1
            and demand.mode == PREFERRED
            and engine.gangs.index(demand).best_domain(RACK, demand.nodes) is not None
        )
        started = time.perf_counter()
        if demand.nodes > 1:
            outcome = place_gang(engine, demand)
        else:
            outcome = engine.place_one(demand)
            outcome = outcome if isinstance(outcome, list) else None
        elapsed += time.perf_counter() - started
        arrived += milli
        if outcome is not None:
            allocated += milli
        if demand.nodes > 1:
            gangs += 1
            used = None if outcome is None else level_used([_paths(engine, b) for b in outcome])
            placed += outcome is not None
            violations += used is not None and demand.mode == REQUIRED and _wider(used, demand.level)
            preferred += rack_holds
            kept += rack_holds and used == RACK
        by_arrived.setdefault(round(100 * arrived / capacity), []).append(100 * allocated / capacity)
    return {
        "alloc_at_100": traces._at(by_arrived, 100),
        "violations": violations,
        "preferred_in_one_rack": 100 * kept / preferred if preferred else float("nan"),
        "gangs": gangs,
        "gangs_placed": placed,
        "decisions": len(demands),
        "seconds": elapsed,
    }


def _paths(engine: PlacementEngine, binding: Binding) -> dict[str, str]:
    return engine.topology.paths[engine.node_index[binding.node]]


def _wider(used: str, asked: str) -> bool:
    return LEVELS.index(used) > LEVELS.index(asked)


def run(data: Path, scale: int, seeds: list[int], inflate: float = 1.3, max_arrivals: int | None = None) -> dict:
    load_start = os.getloadavg()[0]
    base = traces.read_nodes(str(data / NODES_FILE))
    base = scaled_engine_nodes(base, scale) if scale > 1 else base
    pods = traces.read_pods(str(data / PODS_FILE))
    runs: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    ceilings = []
    for seed in seeds:
        nodes = topology_tree(base, seed)
        demands = arrivals(nodes, pods, seed, inflate)[:max_arrivals]
        for variant in VARIANTS:
            runs[variant].append(simulate(nodes, demands, variant, seed))
        ceilings.append({"alloc_at_100": hindsight_bound(nodes, demands, MEMBER)})
    return {
        "nodes": len(base),
        "gpus": sum(len(node.devices) for node in base),
        "seeds": seeds,
        "mix": {
            "gang_share": GANG_SHARE,
            "sizes": dict(GANG_SIZES),
            "topology": {f"{mode} {level}": weight for level, mode, weight in GANG_TOPOLOGY},
            "rack_size": RACK_SIZE,
            "racks_per_block": RACKS_PER_BLOCK,
        },
        "variants": {variant: _summary(results) for variant, results in runs.items()},
        "per_seed_alloc_at_100": {
            variant: [round(r["alloc_at_100"], 2) for r in results] for variant, results in runs.items()
        }
        | {"hindsight bound": [round(c["alloc_at_100"], 2) for c in ceilings]},
        "hindsight_bound": _summary_of(ceilings, "alloc_at_100"),
        "load_avg": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
        "targets": TARGETS,
    }


def _summary_of(results: list[dict], key: str) -> dict:
    values = [r[key] for r in results if r[key] == r[key]]  # NaN: nothing to measure in that run
    if not values:
        return {"mean": None, "std": None}
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": round(statistics.fmean(values), 2), "std": round(spread, 2)}


def _summary(results: list[dict]) -> dict:
    return {
        "alloc_at_100": _summary_of(results, "alloc_at_100"),
        "preferred_in_one_rack": _summary_of(results, "preferred_in_one_rack"),
        "violations": sum(r["violations"] for r in results),
        "gangs": sum(r["gangs"] for r in results),
        "gangs_placed": sum(r["gangs_placed"] for r in results),
        "decisions_per_s": round(sum(r["decisions"] for r in results) / sum(r["seconds"] for r in results)),
    }


def text(summary: dict) -> str:
    lines = [f"{summary['nodes']} nodes, {summary['gpus']} GPUs, seeds {summary['seeds']}"]
    for name, row in summary["variants"].items():
        lines.append(
            f"{name}: alloc@100 {_stat(row['alloc_at_100'])}%  violations {row['violations']}  preferred in one rack "
            f"{_stat(row['preferred_in_one_rack'])}%  gangs placed {row['gangs_placed']}/{row['gangs']}  "
            f"{row['decisions_per_s']} decisions/s"
        )
    lines.append(f"ceiling: hindsight bound alloc@100 {_stat(summary['hindsight_bound'])}% (bench/gang_bound.py)")
    lines.append(f"load avg {summary['load_avg']['start']} -> {summary['load_avg']['end']}")
    return "\n".join(lines)


def _stat(stat: dict) -> str:
    return "n/a" if stat["mean"] is None else f"{stat['mean']:.2f} ± {stat['std']:.2f}"


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--data", type=Path, default=None, help="The openb trace directory.")
        parser.add_argument("--scale", type=int, default=10, help="The node list this many times (10: 12,130 nodes).")
        parser.add_argument("--seeds", default="42-44")
        parser.add_argument("--inflate", type=float, default=1.3)
        parser.add_argument("--max-arrivals", type=int, default=None, help="Only the first N arrivals (a quick run).")
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print one JSON object.")

    def handle(self, *args, data, scale, seeds, inflate, max_arrivals, as_json, **options):
        summary = run(data or openb_dir(), scale, traces.parse_seeds(seeds), inflate, max_arrivals)
        self.stdout.write(json_module.dumps(summary) if as_json else text(summary))
