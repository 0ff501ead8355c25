"""The dotted paths of the scheduling tasks, for django-q2 (which names a task by its path). A leaf module: what
enqueues a task (the release in reclaim.py, the wiring) imports the name from here, not the module that defines or
wires the task, so the cycle's modules import no circle through wiring.py."""

CYCLE_TASK = "scheduling.tasks.run_cycle"
RECLAIM_TASK = "scheduling.tasks.reclaim_allocations"
SLURM_SYNC_TASK = "scheduling.tasks.sync_slurm_node"
SLURM_IMPORT_TASK = "scheduling.tasks.import_from_slurm"
SLURM_STATES_TASK = "scheduling.tasks.refresh_slurm_node_states"
