"""What the MIG engine works on: cards, nodes, demands, and what it answers (bindings, pending reasons,
preemption plans). Pure Python."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduling.mig.geometry import Geometry

MILLI = 1000
WHOLE = "whole"

# Reasons, the same codes as scheduling.engine.
NO_MATCHING_SPEC = "no_matching_spec"
INSUFFICIENT_HEALTHY_CAPACITY = "insufficient_healthy_capacity"
CAPACITY_IN_USE = "capacity_in_use"
TOPOLOGY_CONSTRAINT = "topology_constraint"
FRAGMENTATION = "fragmentation"


# ---------------------------------------------------------------------------------------------------- inventory


@dataclass(frozen=True)
class Instance:
    """A GPU instance on a card: profile, placement, the ids the driver gave it, and whether work holds it."""

    profile: str
    start: int
    size: int
    gi_id: int | None = None
    ci_id: int | None = None
    uuid: str = ""
    busy: bool = False


@dataclass(frozen=True)
class Card:
    """One accelerator. ``geometry`` None: not MIG-capable (whole cards or time-sliced milli shares). A MIG-capable
    card is in ``mig`` mode with ``instances`` or in whole mode; ``pinned`` freezes its layout (no instance created
    or destroyed, no mode change)."""

    index: int
    model: str
    geometry: Geometry | None = None
    mig: bool = False
    instances: tuple[Instance, ...] = ()
    pinned: bool = False
    healthy: bool = True
    busy_milli: int = 0  # whole mode / not MIG-capable: milli in use


@dataclass(frozen=True)
class MigNode:
    name: str
    cpu_milli: int
    memory_mib: int
    cards: tuple[Card, ...] = ()
    schedulable: bool = True
    capabilities: frozenset = frozenset()  # as scheduling.engine's node's


@dataclass(frozen=True)
class SliceDemand:
    """One node, ``count`` cards (whole: ``profile`` None, ``share`` 1000 or a time-sliced milli share on cards
    that are not MIG-capable) or one GPU instance of ``profile`` on a MIG-capable card of ``models``."""

    id: str
    count: int = 1
    profile: str | None = None
    share: int = MILLI
    models: frozenset = frozenset()
    cpu_milli: int = 0
    memory_mib: int = 0
    needs: frozenset = frozenset()  # capabilities the node must offer (scheduling.engine's Demand's)
    needs_label: str = field(default="", compare=False)

    @property
    def klass(self):
        if self.count == 0:
            return None
        return (
            ("slice", self.profile)
            if self.profile
            else ((WHOLE, MILLI) if self.share >= MILLI else ("share", self.share))
        )

    @property
    def label(self) -> str:
        what = "/".join(sorted(self.models)) or "any"
        if self.profile:
            return f"{self.profile} on {what}"
        return f"{self.count}×{'' if self.share >= MILLI else f'{self.share / MILLI:g} of '}{what}"  # noqa: RUF001


@dataclass(frozen=True)
class Placed:
    """What a binding takes on one card: the whole card (``instance`` None, ``milli``), or a GPU instance.
    ``create``: repartitioning creates the instance (a provisioning step); ``mode``: the card changes mode first
    ("mig" or "whole"); ``destroy``: the idle GPU instances the host destroys before (those the new instance would
    overlap, or whose compute, instance count or media engines it needs; every one before a mode change)."""

    card: int
    milli: int
    instance: Instance | None = None
    create: bool = False
    mode: str | None = None
    destroy: tuple[Instance, ...] = ()


@dataclass(frozen=True)
class MigBinding:
    demand_id: str
    node: str
    placed: tuple[Placed, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True)
class Holding:
    """Running work as preemption sees it: what it holds on each card of its node, its CPU and memory, and what
    victims are ordered by."""

    id: str
    node: str
    placed: tuple[Placed, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    started_at: float = 0.0


@dataclass(frozen=True)
class MigPreemptionPlan:
    feasible: bool
    node: str | None = None
    victims: tuple[str, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class MigPending:
    demand_id: str
    reason: str
    message: str
    numbers: Mapping[str, object] = field(default_factory=dict)
