"""django-q2 entry points: take ids, call one service."""

from config.retry import retry_if_locked
from scheduling import cycle, reclaim
from scheduling.notifications import isolation_notify
from scheduling.slurm.services import slurm_inventory_refresh, slurm_node_states_refresh, slurm_node_sync


@retry_if_locked
def run_cycle() -> int:
    return len(cycle.run_cycle().allocated)


@retry_if_locked
def free_allocations(request_ids: list[int], reason: str) -> int:
    return len(reclaim.allocation_free(request_ids=request_ids, reason=reason))


@retry_if_locked
def reclaim_allocations() -> int:
    return reclaim.allocations_reclaim()


@retry_if_locked
def requeue_from_device(device_id: int) -> int:
    return len(reclaim.requeue_from_device(device_id=device_id))


@retry_if_locked
def sync_slurm_node(node_id: int) -> str:
    return slurm_node_sync(node_id=node_id)


@retry_if_locked
def import_from_slurm() -> str:
    return slurm_inventory_refresh()


@retry_if_locked
def refresh_slurm_node_states() -> str:
    return slurm_node_states_refresh()


def notify_isolation(device_id: int, affected_request_ids: list[int], requeued: bool) -> int:
    return isolation_notify(device_id=device_id, affected_request_ids=affected_request_ids, requeued=requeued)
