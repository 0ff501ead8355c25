"""django-q2 entry points: take ids, call one service."""

from config.retry import retry_if_locked
from scheduling import cycle, reclaim
from scheduling.slurm.services import slurm_inventory_refresh, slurm_node_sync


@retry_if_locked
def run_cycle() -> int:
    return len(cycle.run_cycle().allocated)


@retry_if_locked
def free_released(request_id: int, reason: str) -> None:
    reclaim.allocation_release(request_id=request_id, reason=reason)


@retry_if_locked
def reclaim_allocations() -> int:
    reclaim.warn_expiring()
    outcomes = [*reclaim.reclaim_expired().values(), *reclaim.reclaim_stale().values()]
    return outcomes.count(reclaim.RELEASED)


@retry_if_locked
def requeue_from_device(device_id: int) -> int:
    requeued = reclaim.requeue_from_device(device_id=device_id)
    if requeued:
        cycle.run_cycle()
    return len(requeued)


@retry_if_locked
def sync_slurm_node(node_id: int) -> str:
    return slurm_node_sync(node_id=node_id)


@retry_if_locked
def import_from_slurm() -> str:
    return slurm_inventory_refresh()
