"""Workload shapes and node fragmentation (FGD, Weng et al., USENIX ATC'23), pure Python.

A node state is ``(cpu_free, mem_free, devices)`` where ``devices`` is a sorted tuple of ``(model, free_milli)``
over the devices the policy may use (isolated devices never appear). A shape is a typical demand:
``Shape(cpu, mem, count, milli, models, weight)`` with ``models`` empty for "any model".

F_n(m), the fragmentation of node n measured against shape m, is all idle GPU milli of the node when m cannot run
there at all (CPU or memory short, no compatible model, not enough devices with enough free milli), else the idle
milli of the compatible-or-not devices whose free milli is below m's per-device milli. A node's fragmentation is
the popularity-weighted sum over shapes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

MILLI = 1000


class Shape(NamedTuple):
    cpu: int
    mem: int
    count: int
    milli: int
    models: frozenset
    weight: float


def typical_shapes(
    pods: Iterable[tuple[int, int, int, int, frozenset]], threshold: float = 0.95, with_memory: bool = False
) -> list[Shape]:
    """Most popular demand shapes covering ``threshold`` of the pods, weights renormalised to sum to 1.

    ``pods`` yields ``(cpu, mem, count, milli, models)``. As in the FGD simulator (popularity threshold 95%, step 1,
    CPU-only pods included), shapes are grouped by CPU, per-device milli, device count and allowed models; memory
    is part of the shape only when ``with_memory``. Ties in popularity go to the larger shape, like the simulator's
    reverse sort.
    """
    counts: Counter = Counter()
    for cpu, mem, count, milli, models in pods:
        if count == 0 or milli == 0:
            count, milli = 0, 0
        counts[(cpu, mem if with_memory else 0, count, milli, tuple(sorted(models)))] += 1
    total = sum(counts.values())
    if not total:
        return []
    ordered = sorted(
        counts.items(),
        key=lambda item: (item[1], item[0][0], item[0][3], item[0][2], item[0][4], item[0][1]),
        reverse=True,
    )
    chosen, covered = [], 0
    for key, n in ordered:
        if covered >= threshold * total:
            break
        chosen.append((key, n))
        covered += n
    return [
        Shape(cpu, mem, count, milli, frozenset(models), n / covered) for (cpu, mem, count, milli, models), n in chosen
    ]


class FragTable:
    """Memoised fragmentation of node states against a fixed list of shapes.

    For one device tuple the fragmentation is a step function of the free CPU (and memory):
    ``F = idle + sum(w_m * (stranded_m - idle) for the shapes m that fit)``, so each distinct device tuple is
    analysed once and every later query is a bisection (or a short scan when shapes carry memory).
    """

    def __init__(self, shapes: list[Shape], cpu_pods_count: bool = False):
        self.shapes = shapes
        self.cpu_pods_count = cpu_pods_count
        self.with_memory = any(shape.mem for shape in shapes)
        self._tables: dict = {}
        self._cpu_steps = sorted({shape.cpu for shape in shapes})

    def cpu_class(self, cpu_free: int) -> int:
        """How many of the shapes' distinct core counts fit in ``cpu_free``: without memory in the shapes, two free
        CPU amounts of one class give every device tuple the same fragmentation (each table's steps are among them)."""
        return bisect_right(self._cpu_steps, cpu_free)

    def _table(self, devices: tuple):
        idle = 0
        for _model, free in devices:
            idle += free
        entries = []
        for cpu, mem, count, milli, models, weight in self.shapes:
            if milli == 0:
                if not self.cpu_pods_count:
                    entries.append((cpu, mem, -weight * idle))
                continue
            fit = 0
            stranded = 0
            for model, free in devices:
                if free >= milli and (not models or model in models):
                    fit += 1
                else:
                    stranded += free
            if fit >= count:
                entries.append((cpu, mem, weight * (stranded - idle)))
        entries.sort(key=lambda entry: (entry[0], entry[1]))
        cpus = [entry[0] for entry in entries]
        prefix = [0.0]
        for entry in entries:
            prefix.append(prefix[-1] + entry[2])
        table = (idle, cpus, prefix, entries)
        self._tables[devices] = table
        return table

    def frag(self, cpu_free: int, mem_free: int, devices: tuple) -> float:
        table = self._tables.get(devices) or self._table(devices)
        idle, cpus, prefix, entries = table
        if idle == 0:
            return 0.0
        if not self.with_memory:
            return idle + prefix[bisect_right(cpus, cpu_free)]
        total = float(idle)
        for cpu, mem, delta in entries:
            if cpu > cpu_free:
                break
            if mem <= mem_free:
                total += delta
        return total
