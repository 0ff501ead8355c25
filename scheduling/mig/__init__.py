"""MIG as the hardware does it: profile geometry, layout rules, the MIG fragmentation score and a geometry-true
placement engine. Pure Python, no Django (the catalog's geometry rows are turned into `Geometry` by the caller);
the package's Django side is its own two modules, imported by name and never from here: `cycle.py` (the
scheduling cycle's MIG engine over the database's layouts) and `services.py` (layout reports, mode switches).

A MIG-capable card has ``compute_slices`` compute slices and ``memory_slices`` memory slices (H100 80GB: 7 and 8).
A GPU-instance profile takes ``compute`` compute slices and a run of memory slices at one of its allowed placements
``(start, size)``; creating an instance fails when its placement overlaps an occupied one (NVIDIA MIG User Guide,
"Supported MIG Profiles"; ``nvidia-smi mig -lgip`` / ``-lgipp``). A layout is valid when every instance sits at an
allowed placement of its profile, no two instances share a memory slice, the compute slices add up to at most the
card's, no profile has more instances than its table allows, and the card holds at most one media-extension
(``+me``) instance of any size (it has one set of JPEG/OFA engines).

MIG fragmentation score (in the spirit of FGD, Weng et al., ATC'23; scheduling/mig/scoring.py). The workload's
demands give each demand class ``c`` (a whole card, a time-sliced share, or one instance of profile ``p``, each with
the card models the demand may use: a card of another model offers the class nothing) and its
typical shapes ``s`` (class, card count, cores; the most popular covering 95% of demands) popularity weights
``w_s`` (sum 1). For one card, ``usable_c`` is the capacity class ``c`` could still take from it as it is now: for
a profile, the memory slices of the most instances of ``p`` that fit at once in the free slices (free compute
slices and the profile's instance limit included); for a whole card, the full card if it is empty and may change
mode, else nothing. A node's fragmentation is ``F = idle - sum_s w_s * usable_c(s)`` over the shapes ``s`` that
could run there now (enough usable capacity of their class summed over the node's cards, and their cores free; a
slice shape's usable capacity also capped by how many of it the node's free cores can run), in milli-cards
(``1000 / memory_slices`` per memory slice): the idle capacity the typical demand could not use. Among all valid
placements of a demand the engine takes the one on the least contested model (`scoring.model_pressure`), then the
smallest increase ``F(after) - F(before)`` of the node it touches, then the node left with the least idle card
capacity, then the seeded node order, the lowest card index and the lowest start. A partition budget
(scheduling/mig/budget.py) may keep slices off empty cards for whole-card work; each placement carries the host's
plan for its card (`Placed.destroy`, `Placed.mode`; `host_commands`).
"""

from scheduling.mig.budget import DemandMix
from scheduling.mig.engine import MigEngine
from scheduling.mig.geometry import (
    SEEDED,
    SOURCE,
    Geometry,
    Profile,
    create_commands,
    destroy_commands,
    fits_somehow,
    free_starts,
    geometry_problems,
    host_commands,
    idle_in_the_way,
    layout_problems,
    max_pack,
)
from scheduling.mig.model import (
    CAPACITY_IN_USE,
    FRAGMENTATION,
    INSUFFICIENT_HEALTHY_CAPACITY,
    MILLI,
    NO_MATCHING_SPEC,
    TOPOLOGY_CONSTRAINT,
    WHOLE,
    Card,
    Holding,
    Instance,
    MigBinding,
    MigNode,
    MigPending,
    MigPreemptionPlan,
    Placed,
    SliceDemand,
)
from scheduling.mig.scoring import mix_weights, typical_shapes

__all__ = [
    "CAPACITY_IN_USE",
    "FRAGMENTATION",
    "INSUFFICIENT_HEALTHY_CAPACITY",
    "MILLI",
    "NO_MATCHING_SPEC",
    "SEEDED",
    "SOURCE",
    "TOPOLOGY_CONSTRAINT",
    "WHOLE",
    "Card",
    "DemandMix",
    "Geometry",
    "Holding",
    "Instance",
    "MigBinding",
    "MigEngine",
    "MigNode",
    "MigPending",
    "MigPreemptionPlan",
    "Placed",
    "Profile",
    "SliceDemand",
    "create_commands",
    "destroy_commands",
    "fits_somehow",
    "free_starts",
    "geometry_problems",
    "host_commands",
    "idle_in_the_way",
    "layout_problems",
    "max_pack",
    "mix_weights",
    "typical_shapes",
]
