"""The pure placement engine: no Django and no app imports; an in-memory snapshot in, bindings and reasons out.

Split by what it does, around one shared state (`place.PlacementEngine`'s per-node free capacity):

- `model.py` — the data: `Snapshot`, `Demand`, `Binding`, `Pending`, the reason codes;
- `place.py` — placing: the engine's state, `place` / `place_one`, gangs of replicas; `scoring.py` — which node
  is best for a demand shape (the engine's per-shape indexes of node scores);
- `explain.py` — why a demand waits (`Explainer`: counts, topology, fragmentation), in `words.py`'s terms;
- `never_fits.py` — whether a demand could never run on the inventory (`NeverFits`, `unplaceable`);
- `preemption.py` — whom to evict for a demand to fit (`PreemptionPlanner`, `smallest_victim_set`);
- `gang.py` — multi-node gangs: all members or none, inside one rack, block or site of one backend (`GangPlacer`,
  `gang_split`; `with_domain_frees`: when a waiting gang's missing nodes free); `gang_preemption.py` — a gang's
  victims, all inside one domain;
- `frag.py` and `policies.py` — fragmentation and the policies that rank nodes; `backfill.py` — the head of the
  queue's reservation.

Its data classes are named apart from the Django models they are read from, so that a reader (and a module that
imports both) never mistakes one for the other: `DeviceView` and `NodeView` are frozen copies of what the
inventory says of a card and a node, `RunningAllocation` is work that runs now as the snapshot holds it (a
`Binding` is work the engine has just placed).

Callers import from the package: what is listed here is the engine's interface.
"""

from scheduling.engine.frag import MILLI
from scheduling.engine.gang import PREFERRED, REQUIRED, gang_split, with_domain_frees
from scheduling.engine.model import (
    CAPACITY_IN_USE,
    DEGRADED,
    FRAGMENTATION,
    HEALTHY,
    HIGHER_PRIORITY_AHEAD,
    INSUFFICIENT_HEALTHY_CAPACITY,
    ISOLATED,
    NO_MATCHING_SPEC,
    REASONS,
    REPLICAS_SHARE_NODE,
    TOPOLOGY_CONSTRAINT,
    Binding,
    Demand,
    DeviceView,
    NodeView,
    Pending,
    PlacementResult,
    RunningAllocation,
    Snapshot,
)
from scheduling.engine.never_fits import unplaceable
from scheduling.engine.place import PlacementEngine, place, place_in_order, spread_note, workload_source
from scheduling.engine.preemption import PreemptionPlan, smallest_victim_set
from scheduling.engine.words import cards_text, cores_text, memory_text

__all__ = [
    "CAPACITY_IN_USE",
    "DEGRADED",
    "FRAGMENTATION",
    "HEALTHY",
    "HIGHER_PRIORITY_AHEAD",
    "INSUFFICIENT_HEALTHY_CAPACITY",
    "ISOLATED",
    "MILLI",
    "NO_MATCHING_SPEC",
    "PREFERRED",
    "REASONS",
    "REPLICAS_SHARE_NODE",
    "REQUIRED",
    "TOPOLOGY_CONSTRAINT",
    "Binding",
    "Demand",
    "DeviceView",
    "NodeView",
    "Pending",
    "PlacementEngine",
    "PlacementResult",
    "PreemptionPlan",
    "RunningAllocation",
    "Snapshot",
    "cards_text",
    "cores_text",
    "gang_split",
    "memory_text",
    "place",
    "place_in_order",
    "smallest_victim_set",
    "spread_note",
    "unplaceable",
    "with_domain_frees",
    "workload_source",
]
