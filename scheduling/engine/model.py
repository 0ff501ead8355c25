"""The engine's data: what it is given (a `Snapshot` of `NodeView`s with their `DeviceView`s and the
`RunningAllocation`s on them, and `Demand`s to place) and what it answers (`Binding`s and `Pending` reasons).
All frozen, all plain Python; units are integers: milli-CPU, MiB, and milli-device shares (1000 = one card)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduling.engine.frag import MILLI
from scheduling.engine.words import cards_text

HEALTHY, DEGRADED, ISOLATED = "healthy", "degraded", "isolated"

NO_MATCHING_SPEC = "no_matching_spec"
INSUFFICIENT_HEALTHY_CAPACITY = "insufficient_healthy_capacity"
CAPACITY_IN_USE = "capacity_in_use"
TOPOLOGY_CONSTRAINT = "topology_constraint"
FRAGMENTATION = "fragmentation"
HIGHER_PRIORITY_AHEAD = "higher_priority_ahead"
REASONS = (
    NO_MATCHING_SPEC,
    INSUFFICIENT_HEALTHY_CAPACITY,
    CAPACITY_IN_USE,
    TOPOLOGY_CONSTRAINT,
    FRAGMENTATION,
    HIGHER_PRIORITY_AHEAD,
)

REPLICAS_SHARE_NODE = "replicas_share_node"


@dataclass(frozen=True)
class DeviceView:
    """A card as the engine sees it: a frozen copy of what the inventory says (not the `scheduling.models.Device`
    row). ``index`` is its position on its node, the one bindings name."""

    index: int
    model: str
    vendor: str = "nvidia"
    memory_mib: int = 0
    capacity: int = MILLI  # whole-card capacity in milli-shares
    health: str = HEALTHY
    slice_profiles: Mapping[str, int] = field(default_factory=dict)  # MIG profile -> milli-share it occupies


@dataclass(frozen=True)
class NodeView:
    """A node as the engine sees it, with its cards: a frozen copy, not the `scheduling.models.Node` row."""

    name: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[DeviceView, ...] = ()
    schedulable: bool = True
    capabilities: frozenset = frozenset()  # what else the node offers work, e.g. a serving runtime's model file
    # Where it sits, for multi-node gangs (gang.py): names inside its site; empty: unknown (a node without a rack
    # counts as its own rack, a rack without a block as its own block).
    site: str = ""
    block: str = ""
    rack: str = ""
    # The execution backend that runs work on it (slurm, container, ...; empty: unknown). A gang runs as one job of
    # one backend (one Slurm job, one set of containers), so its members never mix nodes of two backends.
    backend: str = ""


@dataclass(frozen=True)
class RunningAllocation:
    """Work that runs now, as the snapshot holds it (not the `scheduling.models.Allocation` row): devices is a tuple
    of (device index, milli). A `Binding` is new work the engine placed; running it makes it one of these."""

    id: str
    node: str
    devices: tuple[tuple[int, int], ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    preemptible: bool = False
    started_at: float = 0.0


@dataclass(frozen=True)
class Demand:
    """What to place. ``share`` is milli per device (1000 = whole card); ``slice_profile`` asks for a MIG slice
    instead (its share comes from each device's profile table). ``models`` empty means any model. A demand runs on
    one node, on healthy devices only (multi-node gangs come with multi-node specs).

    ``replicas`` > 1 asks for that many copies of the shape (a serving deployment's replicas: count, CPU and memory
    are each replica's): placed as a gang, all of them in one call or none, each on a node that holds none of the
    others while one has room (soft anti-affinity: when too few nodes have room they share, evenly).

    ``needs`` are capabilities the node must offer besides devices, CPU and memory (a serving runtime installed
    with the model's file: catalog.runtimes); ``needs_label`` says them in words for the reasons.

    ``nodes`` > 1 asks for a multi-node gang (gang.py): that many members, each the shape above (count, CPU and
    memory per node, whole cards) on a distinct node, all placed or none, inside one domain of ``level`` (rack, block,
    site) when ``mode`` is ``required``; as close as it can, ``level`` first, when ``preferred``."""

    id: str
    count: int = 1
    share: int = MILLI
    slice_profile: str | None = None
    models: frozenset = frozenset()
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    preemptible: bool = False
    replicas: int = 1
    needs: frozenset = frozenset()
    needs_label: str = field(default="", compare=False)
    nodes: int = 1
    level: str = "node"
    mode: str = "required"

    @property
    def label(self) -> str:
        what = "/".join(sorted(self.models)) or "any"
        per = self.slice_profile or ("" if self.share >= MILLI else f"{cards_text(self.share)} of ")
        one = f"{self.count}×{per}{what}"  # noqa: RUF001
        if self.nodes > 1:
            return f"{self.nodes} nodes × {one}"  # noqa: RUF001
        return f"{self.replicas} replicas of {one}" if self.replicas > 1 else one

    @property
    def member(self) -> Demand:
        """One member of a multi-node gang, as a one-node demand of its own."""
        return replace(self, nodes=1, level="node", mode="required")

    @property
    def needs_words(self) -> str:
        """The capabilities it needs, in words: its ``needs_label``, or their names."""
        return self.needs_label or ", ".join(sorted(self.needs))

    @property
    def replica(self) -> Demand:
        """One replica of the demand, as a demand of its own."""
        return replace(self, replicas=1)

    @property
    def colocated(self) -> Demand:
        """All replicas as one demand on one node (for placers without anti-affinity: the MIG engine)."""
        n = self.replicas
        return replace(
            self, count=self.count * n, cpu_milli=self.cpu_milli * n, memory_mib=self.memory_mib * n, replicas=1
        )


@dataclass(frozen=True)
class Snapshot:
    nodes: Sequence[NodeView]
    allocations: Sequence[RunningAllocation] = ()


@dataclass(frozen=True)
class Binding:
    demand_id: str
    node: str
    devices: tuple[tuple[int, int], ...]  # (device index, milli)
    cpu_milli: int
    memory_mib: int
    replica: int | None = None  # which replica of a replicated demand; None: the demand is not replicated
    member: int | None = None  # which member of a multi-node gang (0 leads); None: the demand runs on one node


@dataclass(frozen=True)
class Pending:
    demand_id: str
    reason: str
    message: str
    numbers: Mapping[str, object] = field(default_factory=dict)


@dataclass
class PlacementResult:
    bindings: list[Binding] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)


class DemandShape:
    """A demand resolved for the engine's cached paths: what it asks of a node, and `key`, what demands of one
    shape share (its scores, its reasons)."""

    __slots__ = ("count", "cpu", "devices_key", "key", "mem", "models", "needs", "profile", "share")

    def __init__(self, demand: Demand):
        self.cpu, self.mem, self.count = demand.cpu_milli, demand.memory_mib, demand.count
        self.share, self.models, self.profile = demand.share, demand.models, demand.slice_profile
        self.needs = demand.needs
        self.key = (self.cpu, self.mem, self.count, self.share, self.models, self.profile, self.needs)
        self.devices_key = (self.count, self.share, self.models, self.profile)  # what it needs of the devices
