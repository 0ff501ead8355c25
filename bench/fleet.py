"""Synthetic fleets and workloads from the public openb trace, for benchmarks at K times the openb cluster.

Pure Python, no Django (like `scheduling.engine`): the management commands (`bench_scheduler --scale K`,
`bench_scheduler --steady MINUTES`) and the engine harness (`python -m bench.placement openb --scale K`) build
their fleets and request streams from here, so the engine and the database see the same workload.

Fleet: the openb node list (1,213 nodes, 6,212 GPUs) replicated K times; copy k is site ``site-kk`` and topology
domain ``site-kk/pod-p`` (the openb nodes in groups of 64 per pod), node names ``site-kk-<openb name>``. K = 10
gives 12,130 nodes and 62,120 GPUs.

Workload (the proportions below are the documented mix; `MIX` holds them):
- shapes: the GPU pods of the trace (``openb_pod_list_gpuspec33.csv`` by default: 7,064 GPU pods; 34% of them
  restricted to named models, the trace's own `gpu_spec`), sampled with replacement; CPU-only pods are left out
  (the catalog sells accelerators). Each pod becomes the catalog spec a developer would pick for it: cores rounded
  up to 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, memory up to a power of two GiB, a shared card's milli up to the
  next tenth of a card (268 specs instead of the trace's 415 raw shapes);
- priority: the trace's QoS: best-effort (BE, 42% of GPU pods) becomes ``batch`` (preemptible); of the rest
  (latency-sensitive, burstable, guaranteed) 4% are ``critical``, 12% ``high`` and the others ``standard``;
- projects: ``projects`` projects (default 200) in tenants of 10; requests pick a project with Zipf weights
  1/(rank+1) (a few big consumers, a long tail); every project has a concurrent-task limit (1 in 10 projects a
  tight one, 25 tasks, the rest 5,000) and a monthly card-hour quota (100,000 card-hours, 1 in 10 projects 2,000);
- durations: the trace's own (deletion - scheduled time), whole hours for the request (at least 1, at most 720),
  seconds kept for the steady-state replay's departures.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

NODES_PER_POD = 64  # nodes per topology domain inside a site
CORE_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)


def _catalog_cores(cores: int) -> int:
    return next((size for size in CORE_SIZES if size >= cores), cores)


def _catalog_memory(gb: int) -> int:
    return 1 << max(0, (gb - 1).bit_length())


def _catalog_milli(milli: int) -> int:
    return milli if milli >= 1000 else min(1000, -(-milli // 100) * 100)


@dataclass(frozen=True)
class FleetNode:
    """One node of a replicated fleet, in the openb node list's terms plus where it sits."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str  # openb model code (T4, P100, V100M16, V100M32, A10, G2, G3)
    site: str
    topology_domain: str


def read_openb_nodes(path: str | Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def replicate(rows: list[dict], scale: int) -> list[FleetNode]:
    """The openb node rows K times, copy k in site-kk, topology domains of NODES_PER_POD nodes inside it."""
    if scale < 1:
        raise ValueError("scale must be at least 1")
    fleet = []
    for k in range(scale):
        site = f"site-{k:02d}"
        for position, row in enumerate(rows):
            fleet.append(
                FleetNode(
                    name=f"{site}-{row['sn']}",
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    gpus=int(row["gpu"]),
                    model=row["model"],
                    site=site,
                    topology_domain=f"{site}/pod-{position // NODES_PER_POD:02d}",
                )
            )
    return fleet


@dataclass(frozen=True)
class PodShape:
    """A GPU pod of the trace as an order: cards, milli per card (1000 = whole), host sizes, allowed models."""

    count: int
    milli: int
    cpu_cores: int
    memory_gb: int
    models: tuple[str, ...]  # openb model codes; () = any
    qos: str
    duration_s: int

    @property
    def key(self) -> tuple:
        """What a catalog spec is made of (the same key is one spec)."""
        return (self.count, self.milli, self.cpu_cores, self.memory_gb, self.models)


def read_pod_shapes(path: str | Path) -> list[PodShape]:
    """The trace's GPU pods (CPU-only ones dropped), name order."""
    shapes = []
    with open(path, newline="") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: row["name"])
    for row in rows:
        count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        if count == 0 or milli == 0:
            continue
        start = int(row.get("scheduled_time") or row.get("creation_time") or 0)
        end = int(row.get("deletion_time") or 0)
        shapes.append(
            PodShape(
                count=count,
                milli=_catalog_milli(milli),
                cpu_cores=_catalog_cores(max(1, math.ceil(int(row["cpu_milli"]) / 1000))),
                memory_gb=_catalog_memory(max(1, math.ceil(int(row["memory_mib"]) / 1024))),
                models=tuple(sorted(m for m in (row.get("gpu_spec") or "").split("|") if m)),
                qos=row.get("qos") or "LS",
                duration_s=max(60, end - start) if end > start else 3600,
            )
        )
    return shapes


@dataclass(frozen=True)
class Mix:
    batch_qos: tuple[str, ...] = ("BE",)
    critical: float = 0.04  # of the non-batch requests
    high: float = 0.12
    tight_every: int = 10  # every tight_every-th project has the tight limits
    tight_concurrent: int = 25
    concurrent: int = 5000
    tight_card_hours: int = 2000
    card_hours: int = 100_000
    tenant_size: int = 10  # projects per tenant


MIX = Mix()


@dataclass(frozen=True)
class SyntheticRequest:
    shape: PodShape
    priority: str  # batch / standard / high / critical (tenancy.choices.PriorityClass values)
    project: int  # 0 .. projects - 1
    duration_hours: int


def priority_of(shape: PodShape, rng: random.Random, mix: Mix = MIX) -> str:
    if shape.qos in mix.batch_qos:
        return "batch"
    draw = rng.random()
    if draw < mix.critical:
        return "critical"
    if draw < mix.critical + mix.high:
        return "high"
    return "standard"


def project_weights(projects: int) -> list[float]:
    return [1 / (rank + 1) for rank in range(projects)]


def draw_requests(
    shapes: list[PodShape], count: int, *, projects: int = 200, seed: int = 42, mix: Mix = MIX
) -> list[SyntheticRequest]:
    """`count` requests: shapes sampled with replacement, priority and project drawn as the mix says."""
    rng = random.Random(seed)
    weights = project_weights(projects)
    picked = rng.choices(shapes, k=count)
    owners = rng.choices(range(projects), weights=weights, k=count)
    return [
        SyntheticRequest(
            shape=shape,
            priority=priority_of(shape, rng, mix),
            project=project,
            duration_hours=min(720, max(1, math.ceil(shape.duration_s / 3600))),
        )
        for shape, project in zip(picked, owners, strict=True)
    ]


def project_limits(project: int, mix: Mix = MIX) -> tuple[int, int]:
    """(concurrent tasks, monthly card-hours) of project number `project`."""
    tight = project % mix.tight_every == mix.tight_every - 1
    return (mix.tight_concurrent, mix.tight_card_hours) if tight else (mix.concurrent, mix.card_hours)


def scaled_engine_nodes(nodes: list, scale: int) -> list:
    """The engine's NodeView objects K times with distinct names (the engine harness has no sites)."""
    return [replace(node, name=f"site-{k:02d}-{node.name}") for k in range(scale) for node in nodes]
