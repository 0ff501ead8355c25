"""Placement benchmark on the Alibaba openb traces, following the FGD paper's protocol (USENIX ATC'23); run by
`python -m bench.placement openb` (bench/placement.py).

Per seed: pods sorted by name then shuffled with the seed; pods sampled with replacement from the name-sorted trace
are appended while the running total of requested GPU milli plus the sampled pod's per-GPU milli stays within
``inflate`` * cluster GPU capacity (a trace already above it loses random pods until it is not); arrivals only, each
pod tried once. After each pod, arrived% = round(100 * arrived GPU milli / capacity) (failed pods included) and
alloc% = 100 * allocated GPU milli / capacity; the figure at x% is the mean alloc% over events at arrived x% (else
x ± 1). Fragmentation at 100% is the expected stranded GPU milli (typical shapes of the trace, CPU-only shapes
strand nothing when they fit) as a share of capacity, averaged the same way.
"""

from __future__ import annotations

import csv
import random
import resource
import statistics
import time
from dataclasses import dataclass

from bench.fleet import scaled_engine_nodes
from scheduling.engine import Demand, DeviceView, NodeView, PlacementEngine, Snapshot
from scheduling.engine.frag import MILLI, FragTable, typical_shapes
from scheduling.engine.policies import DEFAULT_POLICY, make_policy


@dataclass(frozen=True)
class Pod:
    name: str
    cpu: int
    mem: int
    num_gpu: int
    milli: int
    spec: frozenset

    @property
    def gpu_milli(self) -> int:
        return self.num_gpu * self.milli


def read_nodes(path: str) -> list[NodeView]:
    with open(path, newline="") as handle:
        return [
            NodeView(
                row["sn"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                tuple(DeviceView(j, row["model"]) for j in range(int(row["gpu"]))),
            )
            for row in csv.DictReader(handle)
        ]


def read_pods(path: str) -> list[Pod]:
    pods = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            num, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if num == 0 or milli == 0:
                num, milli = 0, 0
            spec = frozenset(m for m in (row.get("gpu_spec") or "").split("|") if m)
            pods.append(Pod(row["name"], int(row["cpu_milli"]), int(row["memory_mib"]), num, milli, spec))
    return pods


def workload(pods: list[Pod], capacity: int, seed: int, inflate: float) -> list[Pod]:
    """The seeded arrival sequence of the FGD protocol."""
    ordered = sorted(pods, key=lambda pod: pod.name)
    rng = random.Random(seed)
    sequence = list(ordered)
    rng.shuffle(sequence)
    target = inflate * capacity
    total = sum(pod.gpu_milli for pod in sequence)
    while total > target and sequence:
        total -= sequence.pop(rng.randrange(len(sequence))).gpu_milli
    while ordered:
        pod = ordered[rng.randrange(len(ordered))]
        if total + pod.milli > target:
            break
        sequence.append(pod)
        total += pod.gpu_milli
    return sequence


def demand_of(pod: Pod, n: int) -> Demand:
    return Demand(
        f"{pod.name}#{n}",
        count=pod.num_gpu,
        share=pod.milli or MILLI,
        models=pod.spec,
        cpu_milli=pod.cpu,
        memory_mib=pod.mem,
    )


def simulate(nodes: list[NodeView], pods: list[Pod], policy: str, seed: int, inflate: float = 1.3) -> dict:
    capacity = sum(len(node.devices) for node in nodes) * MILLI
    sequence = workload(pods, capacity, seed, inflate)
    shapes_source = [(p.cpu, p.mem, p.num_gpu, p.milli, p.spec) for p in sorted(pods, key=lambda pod: pod.name)]
    engine = PlacementEngine(Snapshot(nodes), make_policy(policy, shapes_source), seed=seed)
    report_table = FragTable(typical_shapes(shapes_source))
    arrived = allocated = 0
    by_arrived: dict[int, list[float]] = {}
    frag_at_100: list[float] = []
    reasons: dict[str, int] = {}
    elapsed = cpu = 0.0
    clock, cpu_clock = time.perf_counter, time.process_time
    for n, pod in enumerate(sequence):
        demand = demand_of(pod, n)
        started, cpu_started = clock(), cpu_clock()
        outcome = engine.place_one(demand)
        elapsed += clock() - started
        cpu += cpu_clock() - cpu_started
        arrived += pod.gpu_milli
        if isinstance(outcome, list):
            allocated += pod.gpu_milli
        else:
            reasons[outcome.reason] = reasons.get(outcome.reason, 0) + 1
        arrived_pct = round(100 * arrived / capacity)
        by_arrived.setdefault(arrived_pct, []).append(100 * allocated / capacity)
        if arrived_pct == 100 and pod.gpu_milli:
            frag_at_100.append(100 * engine.cluster_frag(report_table) / capacity)
    return {
        "seed": seed,
        "pods": len(sequence),
        "alloc_at_100": _at(by_arrived, 100),
        "alloc_at_130": _at(by_arrived, round(100 * inflate)),
        "frag_at_100": statistics.fmean(frag_at_100) if frag_at_100 else float("nan"),
        "decisions_per_s": len(sequence) / elapsed if elapsed else float("inf"),
        "decisions_per_cpu_s": len(sequence) / cpu if cpu else float("inf"),
        "reasons": reasons,
    }


def _at(by_arrived: dict[int, list[float]], x: int) -> float:
    for candidate in (x, x - 1, x + 1):
        if by_arrived.get(candidate):
            return statistics.fmean(by_arrived[candidate])
    return float("nan")


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-")
            seeds.extend(range(int(low), int(high) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def run(nodes_path: str, pods_path: str, policy: str, seeds: list[int], inflate: float = 1.3, scale: int = 1) -> dict:
    """At --scale K the cluster is the node list K times (distinct names) and the arrival sequence is K times as
    long (the protocol samples pods up to `inflate` times the capacity), so decisions/s compare fleet sizes."""
    nodes, pods = read_nodes(nodes_path), read_pods(pods_path)
    if scale > 1:
        nodes = scaled_engine_nodes(nodes, scale)
    runs = [simulate(nodes, pods, policy, seed, inflate) for seed in seeds]
    return {**summarise(policy, seeds, runs), "nodes": len(nodes), "gpus": sum(len(n.devices) for n in nodes)}


def summarise(policy: str, seeds: list[int], runs: list[dict]) -> dict:
    def stat(key):
        values = [r[key] for r in runs if r[key] == r[key]]  # NaN: no event at that arrival level
        if not values:
            return {"mean": None, "std": None}
        return {
            "mean": round(statistics.fmean(values), 2),
            "std": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
        }

    total_pods = sum(r["pods"] for r in runs)
    total_time = sum(r["pods"] / r["decisions_per_s"] for r in runs)
    total_cpu = sum(r["pods"] / r["decisions_per_cpu_s"] for r in runs)
    return {
        "policy": DEFAULT_POLICY if policy == "default" else policy,
        "seeds": seeds,
        "alloc_at_100": stat("alloc_at_100"),
        "alloc_at_130": stat("alloc_at_130"),
        "frag_at_100": stat("frag_at_100"),
        "decisions_per_s": round(total_pods / total_time),
        "decisions_per_cpu_s": round(total_pods / total_cpu),  # CPU time: what a loaded machine does not distort
        "peak_mem_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
