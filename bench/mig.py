"""MIG benchmark on the openb traces (``python -m bench.placement mig --json``: default, gpushare100 and gpuspec33
from the trace directory; ``--nodes … --pods …`` for one trace).

Mapping (deterministic, documented in docs/benchmarks/history.md):
- nodes: the openb node list; its undisclosed 8-GPU ``G2`` nodes become H100 80GB cards and ``G3`` nodes A100 80GB
  cards (MIG-capable, 7 compute and 8 memory slices, NVIDIA's placements); T4/P100/V100/A10 cards stay whole cards.
- pods: a fractional-GPU pod (one GPU, milli < 1000) asks for the smallest H100/A100 80GB profile (the two cards
  share profile names and placements) whose compute fraction (g/7) and memory fraction (memory slices/8) both cover
  its share, on a MIG-capable card; whole-GPU pods ask for whole cards; CPU-only pods for CPU/memory. A pod's
  GPU-model constraint (``gpu_spec``, gpuspec33) is honoured: its models, mapped as the nodes are, are the only ones
  it may use; a fractional pod that allows no MIG-capable model is a time-sliced share of the cards it names.
- protocol: the openb arrival sequence of ``bench.traces`` (seeded shuffle, sampling up to 1.3x capacity),
  arrivals only, each pod tried once; alloc% = allocated requested GPU milli / capacity, averaged over the events at
  arrived 100% (the same counting for every variant).

Variants: ``mig-frag`` (the MIG fragmentation score, repartitioning, the partition budget from the demand mix seen
so far: what the cycle runs), the same without the budget, first-fit over valid placements with repartitioning as
the baseline; on the default trace also ``frag`` without repartitioning (MIG-capable cards laid out once from the
trace's profile mix, see `static_layout`), the milli-share model (``scheduling.engine`` with 1g = 142 milli …)
whose final card layouts are checked against the geometry, and the ceilings (`ceilings`): perfect packing in
arrival order and the hindsight LP bound.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from pathlib import Path

from bench.traces import Pod, _at, read_nodes, read_pods, workload
from scheduling.engine import Demand, DeviceView, NodeView, PlacementEngine, Snapshot
from scheduling.mig import (
    MILLI,
    SEEDED,
    Card,
    Instance,
    MigBinding,
    MigEngine,
    MigNode,
    SliceDemand,
    fits_somehow,
    free_starts,
    layout_problems,
)
from scheduling.mig.budget import DemandMix

MIG_MODELS = {"G2": "H100 80GB", "G3": "A100 80GB"}
REFERENCE = SEEDED["H100 80GB"]


def profile_for(milli: int) -> str:
    """Smallest profile (compute, then memory) covering the share in compute and in memory; no +me profiles."""
    g = REFERENCE
    best = None
    for p in g.profiles:
        if "+" in p.name:
            continue
        covers = p.compute * MILLI >= milli * g.compute_slices and p.memory_slices * MILLI >= milli * g.memory_slices
        if covers and (best is None or (p.compute, p.memory_slices) < (best.compute, best.memory_slices)):
            best = p
    return best.name


def mig_nodes(path: str) -> list[MigNode]:
    nodes = []
    for node in read_nodes(path):
        model = node.devices[0].model if node.devices else ""
        mapped = MIG_MODELS.get(model)
        cards = tuple(Card(d.index, mapped, SEEDED[mapped]) if mapped else Card(d.index, d.model) for d in node.devices)
        nodes.append(MigNode(node.name, node.cpu_milli, node.memory_mib, cards))
    return nodes


MIG_CAPABLE = frozenset(MIG_MODELS.values())


def demand_of(pod: Pod, n: int) -> SliceDemand:
    """The pod as the engine sees it, on the models its GPU-model constraint names (mapped as the nodes are): a
    fractional pod is a MIG slice when a MIG-capable model is allowed (on those models only), else a time-sliced
    share of the cards it names; other GPU pods take whole cards."""
    allowed = frozenset(MIG_MODELS.get(model, model) for model in pod.spec)
    if pod.num_gpu == 1 and pod.milli < MILLI:
        capable = allowed & MIG_CAPABLE if allowed else MIG_CAPABLE
        if not capable:
            return SliceDemand(
                f"{pod.name}#{n}", 1, share=pod.milli, models=allowed, cpu_milli=pod.cpu, memory_mib=pod.mem
            )
        return SliceDemand(
            f"{pod.name}#{n}",
            1,
            profile=profile_for(pod.milli),
            models=capable,
            cpu_milli=pod.cpu,
            memory_mib=pod.mem,
        )
    return SliceDemand(f"{pod.name}#{n}", pod.num_gpu, models=allowed, cpu_milli=pod.cpu, memory_mib=pod.mem)


def static_layout(nodes: list[MigNode], pods: list[Pod]) -> list[MigNode]:
    """Layouts for the no-repartitioning variant, from the whole trace's demand (not the arrival order).

    Whole-card demand beyond the cards that are not MIG-capable keeps that many MIG-capable cards in whole mode
    (the cards of whole nodes, last nodes first); the others go to MIG mode, and their instances are the profile
    demand in proportion to its memory slices, packed first-fit-decreasing at NVIDIA's placements, the slices left
    over filled with 1g.10gb."""
    plain = sum(1 for node in nodes for card in node.cards if card.geometry is None)
    capable = [(i, card.index) for i, node in enumerate(nodes) for card in node.cards if card.geometry is not None]
    whole_milli = sum(p.gpu_milli for p in pods if p.num_gpu and p.milli >= MILLI)
    profiles = Counter(profile_for(p.milli) for p in pods if p.num_gpu == 1 and p.milli < MILLI)
    slice_slices = sum(REFERENCE.profile(name).memory_slices * n for name, n in profiles.items())
    extra_whole = max(0, whole_milli - plain * MILLI) / MILLI
    slice_cards = slice_slices / REFERENCE.memory_slices
    mig_cards = round(len(capable) * slice_cards / (slice_cards + extra_whole)) if slice_cards else 0
    total = sum(profiles.values())
    wanted = []  # per MIG card the profiles to lay out, by demand share
    scale = mig_cards * REFERENCE.memory_slices / slice_slices if slice_slices else 0
    for name, n in sorted(profiles.items(), key=lambda item: -REFERENCE.profile(item[0]).memory_slices):
        wanted.extend([name] * round(n * scale))
    layouts: list[list[tuple[str, int, int]]] = [[] for _ in range(mig_cards)]
    for name in wanted:  # first-fit decreasing over the MIG cards
        profile = REFERENCE.profile(name)
        for layout in layouts:
            occupied = sum(((1 << z) - 1) << s for _n, s, z in layout)
            compute = sum(REFERENCE.profile(n).compute for n, _s, _z in layout)
            starts = free_starts(REFERENCE, profile, occupied, compute, Counter(n for n, _s, _z in layout))
            if starts:
                layout.append((name, starts[0], profile.memory_slices))
                break
    filler = REFERENCE.profile(profile_for(1))
    for layout in layouts:
        while True:
            occupied = sum(((1 << z) - 1) << s for _n, s, z in layout)
            compute = sum(REFERENCE.profile(n).compute for n, _s, _z in layout)
            starts = free_starts(REFERENCE, filler, occupied, compute, Counter(n for n, _s, _z in layout))
            if not starts:
                break
            layout.append((filler.name, starts[0], filler.memory_slices))
    del total
    by_card = dict(zip(capable[:mig_cards], layouts, strict=True))
    out = []
    for i, node in enumerate(nodes):
        cards = []
        for card in node.cards:
            layout = by_card.get((i, card.index))
            if layout is None:
                cards.append(Card(card.index, card.model, card.geometry, mig=False, pinned=card.geometry is not None))
            else:
                instances = tuple(Instance(n, s, z, gi_id=k + 1, ci_id=0) for k, (n, s, z) in enumerate(layout))
                cards.append(Card(card.index, card.model, card.geometry, mig=True, instances=instances, pinned=True))
        out.append(MigNode(node.name, node.cpu_milli, node.memory_mib, tuple(cards)))
    return out


def simulate(nodes, pods, seed, *, policy="frag", repartition=True, budget=False, inflate=1.3) -> dict:
    """One seed of the protocol. ``budget``: the engine keeps a partition budget from the demand mix seen so far
    (`scheduling.mig.budget`), updated before each pod is placed."""
    capacity = sum(len(node.cards) for node in nodes) * MILLI
    sequence = workload(pods, capacity, seed, inflate)
    shapes = [demand_of(p, 0) for p in sorted(pods, key=lambda pod: pod.name)]
    engine = MigEngine(nodes, policy=policy, repartition=repartition, workload=shapes, seed=seed)
    capable = sum(1 for node in nodes for card in node.cards if card.geometry is not None)
    mix = DemandMix(capable, capacity // MILLI - capable, MIG_CAPABLE) if budget else None
    arrived = allocated = 0
    accepted_slices = slice_demands = off_constraint = 0
    by_arrived: dict[int, list[float]] = {}
    reasons: Counter = Counter()
    elapsed = 0.0
    clock = time.process_time  # CPU time of this process: one core, whatever else the machine runs
    for n, pod in enumerate(sequence):
        demand = demand_of(pod, n)
        started = clock()
        if mix is not None:
            mix.see(demand, pod.milli)
            engine.partition_budget = mix.budget
        outcome = engine.place_one(demand)
        elapsed += clock() - started
        arrived += pod.gpu_milli
        if demand.profile:
            slice_demands += 1
        if isinstance(outcome, MigBinding):
            allocated += pod.gpu_milli
            accepted_slices += bool(demand.profile)
            off_constraint += _off_constraint(engine, demand, outcome)
        else:
            reasons[outcome.reason] += 1
        by_arrived.setdefault(round(100 * arrived / capacity), []).append(100 * allocated / capacity)
    invalid = sum(1 for _node, _card, g, layout in engine.layouts() if layout_problems(g, layout))
    return {
        "seed": seed,
        "pods": len(sequence),
        "alloc_at_100": _at(by_arrived, 100),
        "slice_demands": slice_demands,
        "accepted_slice_demands": accepted_slices,
        "invalid_layouts": invalid,
        "off_constraint": off_constraint,
        "decisions_per_s": len(sequence) / elapsed if elapsed else float("inf"),
        "reasons": dict(reasons),
    }


def _off_constraint(engine: MigEngine, demand: SliceDemand, binding: MigBinding) -> int:
    """1 when a binding uses a card of a model its pod's constraint does not allow (it must never happen)."""
    if not demand.models:
        return 0
    cards = engine.nodes[engine.node_index[binding.node]].cards
    return int(any(cards[p.card].model not in demand.models for p in binding.placed))


def milli_model(node_path: str, pods: list[Pod], seed: int, inflate: float = 1.3) -> dict:
    """Today's model: a slice is a milli-share (compute fraction, 1g = 142) of a card; count the cards whose
    final set of slices no MIG layout can hold, and the bindings that made a card's set impossible."""
    shares = {p.name: p.compute * MILLI // REFERENCE.compute_slices for p in REFERENCE.profiles}
    nodes = []
    for node in read_nodes(node_path):
        mapped = MIG_MODELS.get(node.devices[0].model if node.devices else "")
        devices = tuple(
            DeviceView(d.index, mapped or d.model, slice_profiles=shares if mapped else {}) for d in node.devices
        )
        nodes.append(NodeView(node.name, node.cpu_milli, node.memory_mib, devices))
    geometry = {node.name: {d.index: SEEDED[d.model] for d in node.devices if d.model in SEEDED} for node in nodes}
    capacity = sum(len(node.devices) for node in nodes) * MILLI
    sequence = workload(pods, capacity, seed, inflate)

    def as_demand(pod: Pod, n: int) -> Demand:
        if pod.num_gpu == 1 and pod.milli < MILLI:
            return Demand(
                f"{pod.name}#{n}", 1, slice_profile=profile_for(pod.milli), cpu_milli=pod.cpu, memory_mib=pod.mem
            )
        return Demand(f"{pod.name}#{n}", pod.num_gpu, cpu_milli=pod.cpu, memory_mib=pod.mem)

    engine = PlacementEngine(Snapshot(nodes), "default", seed=seed, workload=[as_demand(p, 0) for p in pods])
    held: dict[tuple[str, int], list[str]] = {}
    bad_decisions = 0
    for n, pod in enumerate(sequence):
        demand = as_demand(pod, n)
        outcome = engine.place_one(demand)
        if not isinstance(outcome, list) or not demand.slice_profile:
            continue
        for binding in outcome:
            for index, _milli in binding.devices:
                names = held.setdefault((binding.node, index), [])
                names.append(demand.slice_profile)
                if not fits_somehow(geometry[binding.node][index], names):
                    bad_decisions += 1
    invalid = sum(1 for (node, index), names in held.items() if not fits_somehow(geometry[node][index], names))
    return {"seed": seed, "invalid_layouts": invalid, "invalid_decisions": bad_decisions}


def ceilings(nodes: list[MigNode], pods: list[Pod], seed: int, inflate: float = 1.3) -> dict:
    """What alloc@100 could be at most, ignoring CPU, memory and node boundaries (all cards pooled: the MIG cards'
    memory and compute slices, the other cards whole), over the pods that arrived by 100%:

    - ``perfect_packing``: every pod placed in arrival order whenever the pool still has room for it, as an
      engine that places whatever fits would do with perfect packing;
    - ``hindsight``: the LP bound of the best subset chosen knowing the whole sequence (surrogate relaxation of the
      two slice constraints, minimised over the weight): reachable only by refusing work that fits.
    """
    capacity = sum(len(node.cards) for node in nodes) * MILLI
    mig_cards = sum(1 for node in nodes for card in node.cards if card.geometry is not None)
    arrived, total = [], 0
    for pod in workload(pods, capacity, seed, inflate):
        if total + pod.gpu_milli > capacity:
            break
        total += pod.gpu_milli
        if pod.num_gpu:
            arrived.append(pod)
    plain = len([c for node in nodes for c in node.cards]) - mig_cards
    return {
        "perfect_packing": 100 * _pooled_in_order(arrived, mig_cards, plain) / capacity,
        "hindsight": 100 * min(_surrogate_lp(arrived, capacity, k / 20) for k in range(21)) / capacity,
    }


def _slice_profile(pod: Pod):
    return REFERENCE.profile(profile_for(pod.milli)) if pod.num_gpu == 1 and pod.milli < MILLI else None


def _pooled_in_order(arrived: list[Pod], mig_cards: int, plain: int) -> int:
    memory, compute, got = REFERENCE.memory_slices * mig_cards, REFERENCE.compute_slices * mig_cards, 0
    for pod in arrived:
        profile = _slice_profile(pod)
        need = (profile.memory_slices, profile.compute) if profile else None
        if profile is None:  # whole cards: the plain ones first, then whole MIG cards
            rest = pod.num_gpu - min(plain, pod.num_gpu)
            need = (REFERENCE.memory_slices * rest, REFERENCE.compute_slices * rest)
        if need[0] <= memory and need[1] <= compute:
            memory, compute, got = memory - need[0], compute - need[1], got + pod.gpu_milli
            if profile is None:
                plain -= min(plain, pod.num_gpu)
    return got


def _surrogate_lp(arrived: list[Pod], capacity: int, weight: float) -> float:
    """Fractional knapsack with each slice costing ``weight`` x its memory fraction + the rest x its compute
    fraction of a card (an upper bound of the two-constraint LP for every weight)."""
    items = []
    for pod in arrived:
        profile = _slice_profile(pod)
        cost = pod.gpu_milli
        if profile is not None:
            fraction = weight * profile.memory_slices / REFERENCE.memory_slices
            cost = (fraction + (1 - weight) * profile.compute / REFERENCE.compute_slices) * MILLI
        items.append((pod.gpu_milli, cost))
    items.sort(key=lambda item: -item[0] / item[1])
    left, value = capacity, 0.0
    for gain, cost in items:
        if left <= 0:
            break
        taken = min(1.0, left / cost)
        value, left = value + gain * taken, left - cost * taken
    return value


def _stat(values):
    values = [v for v in values if v == v]
    if not values:
        return {"mean": None, "std": None}
    return {
        "mean": round(statistics.fmean(values), 2),
        "std": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
    }


def _summary(policy: str, runs: list[dict]) -> dict:
    pods = sum(r["pods"] for r in runs)
    seconds = sum(r["pods"] / r["decisions_per_s"] for r in runs)
    return {
        "policy": policy,
        "alloc_at_100": _stat([r["alloc_at_100"] for r in runs]),
        "accepted_slice_demands": _stat([r["accepted_slice_demands"] for r in runs]),
        "slice_demands": _stat([r["slice_demands"] for r in runs]),
        "invalid_layouts": sum(r["invalid_layouts"] for r in runs),
        "off_constraint": sum(r["off_constraint"] for r in runs),
        "decisions_per_s": round(pods / seconds),
    }


TRACES = {
    "openb default": "openb_pod_list_default.csv",
    "openb gpushare100": "openb_pod_list_gpushare100.csv",
    "openb gpuspec33": "openb_pod_list_gpuspec33.csv",
}
NODES = "openb_node_list_gpu_node.csv"
TARGETS = {"alloc_at_100": 91.5, "alloc_at_100_stretch": 92.3, "decisions_per_s": 5000}


def openb_dir() -> Path:
    """Where the traces are read (never copied into the project): $OPENB_DIR, else shared/data/openb beside it."""
    return Path(os.environ.get("OPENB_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data" / "openb")


def run(nodes_path: str, pods_path: str, seeds: list[int], inflate: float = 1.3, extras: bool = True) -> dict:
    """One trace: the variants, and with ``extras`` the static layouts, the milli-share model and the ceilings."""
    nodes, pods = mig_nodes(nodes_path), read_pods(pods_path)
    main = _summary("mig-frag", [simulate(nodes, pods, s, budget=True, inflate=inflate) for s in seeds])
    main["seeds"] = seeds
    main["without_budget"] = _summary("mig-frag-no-budget", [simulate(nodes, pods, s, inflate=inflate) for s in seeds])
    main["baseline"] = _summary(
        "mig-first-fit", [simulate(nodes, pods, s, policy="first-fit", inflate=inflate) for s in seeds]
    )
    if not extras:
        return main
    static = static_layout(nodes, pods)
    main["no_repartitioning"] = _summary(
        "mig-frag-static", [simulate(static, pods, s, repartition=False, inflate=inflate) for s in seeds]
    )
    bounds = [ceilings(nodes, pods, s, inflate) for s in seeds]
    main["ceiling_perfect_packing"] = _stat([b["perfect_packing"] for b in bounds])
    main["ceiling_hindsight"] = _stat([b["hindsight"] for b in bounds])
    runs = [milli_model(nodes_path, pods, s, inflate) for s in seeds]
    main["milli_model_invalid_layouts"] = _stat([r["invalid_layouts"] for r in runs])
    main["milli_model_invalid_decisions"] = _stat([r["invalid_decisions"] for r in runs])
    return main


def run_all(data: Path, seeds: list[int], inflate: float = 1.3) -> dict:
    """The three traces in one process, the hindsight bound of the default trace beside the figures, the targets
    (issue 32) checked, and the machine's load average at the start and the end (a shared machine slows
    decisions/s, which is CPU time of this process)."""
    load = os.getloadavg()[0]
    traces = {
        name: run(str(data / NODES), str(data / file), seeds, inflate, extras=name == "openb default")
        for name, file in TRACES.items()
    }
    default = traces["openb default"]
    got = default["alloc_at_100"]["mean"]
    slowest = min(trace["decisions_per_s"] for trace in traces.values())
    return {
        "seeds": seeds,
        "inflate": inflate,
        "hindsight_bound": default["ceiling_hindsight"],
        "perfect_packing": default["ceiling_perfect_packing"],
        "traces": traces,
        "targets": {
            "default_alloc_at_100": {
                "got": got,
                "target": TARGETS["alloc_at_100"],
                "stretch": TARGETS["alloc_at_100_stretch"],
                "met": got >= TARGETS["alloc_at_100"],
                "stretch_met": got >= TARGETS["alloc_at_100_stretch"],
            },
            **{
                f"{name.split()[1]}_at_least_first_fit": {
                    "got": traces[name]["alloc_at_100"]["mean"],
                    "first_fit": traces[name]["baseline"]["alloc_at_100"]["mean"],
                    "met": traces[name]["alloc_at_100"]["mean"] >= traces[name]["baseline"]["alloc_at_100"]["mean"],
                }
                for name in ("openb gpushare100", "openb gpuspec33")
            },
            **{
                key: {"got": total, "met": total == 0}
                for key in ("invalid_layouts", "off_constraint")
                for total in [sum(trace[key] for trace in traces.values())]
            },
            "decisions_per_s": {"got": slowest, "target": TARGETS["decisions_per_s"], "met": slowest >= 5000},
        },
        "load_avg": {"start": round(load, 1), "end": round(os.getloadavg()[0], 1)},
    }
