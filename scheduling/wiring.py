"""What starts scheduling work: signals from requests and health, and the periodic schedules."""

from django_q.tasks import async_task

from config import schedules
from scheduling.choices import ExecutionBackend
from scheduling.task_names import CYCLE_TASK, RECLAIM_TASK, SLURM_IMPORT_TASK, SLURM_STATES_TASK, SLURM_SYNC_TASK


def trigger_cycle(**_kwargs) -> None:
    async_task(CYCLE_TASK)


def cycle_when_available(*, available: bool, **_kwargs) -> None:
    """Capacity came back (an uncordon, by an operator or by the Slurm import once Slurm resumed the node, an
    isolation cleared, or a backend that answers again): the queue is placed now, not at the next minute's cycle."""
    if available:
        trigger_cycle()


def drain_in_slurm(*, node_id: int, execution_backend: str, **_kwargs) -> None:
    """A Slurm-backed node's cordon or card isolation changed: drain or resume it in Slurm, in a task."""
    if execution_backend == ExecutionBackend.SLURM:
        async_task(SLURM_SYNC_TASK, node_id)


def ensure_schedules(**_kwargs) -> None:
    """A cycle every minute as a safety net (events trigger one at once), reclamation every minute, Slurm's node
    states every minute and the whole Slurm inventory every five (both no-ops while no Slurm cluster is
    configured)."""
    schedules.ensure(
        ("Scheduling cycle", CYCLE_TASK, schedules.EVERY_MINUTE),
        ("Reclaim expired and stale allocations", RECLAIM_TASK, schedules.EVERY_MINUTE),
        ("Read node states from Slurm", SLURM_STATES_TASK, schedules.EVERY_MINUTE),
        ("Import inventory from Slurm", SLURM_IMPORT_TASK, schedules.EVERY_FIVE_MINUTES),
    )


def connect() -> None:
    from django.db.models.signals import post_migrate

    from config import metrics
    from requests import hooks
    from requests.signals import request_queued
    from scheduling import reservation_windows
    from scheduling.allocations import allocation_details
    from scheduling.estimate import order_never_fits, orders_never_fit, placement_estimate
    from scheduling.expected_start import starts_if_approved
    from scheduling.metrics import SchedulerCollector
    from scheduling.signals import backend_availability_changed, health_changed, node_availability_changed

    hooks.register(hooks.ALLOCATION_DETAILS, allocation_details)
    hooks.register(hooks.PLACEMENT_ESTIMATE, placement_estimate)
    hooks.register(hooks.ORDER_NEVER_FITS, order_never_fits)
    hooks.register(hooks.HELD_ENDS, reservation_windows.held_ends)
    hooks.register(hooks.EARLIEST_WINDOW, reservation_windows.earliest_window)
    hooks.register(hooks.ORDERS_NEVER_FIT, orders_never_fit)
    hooks.register(hooks.STARTS_IF_APPROVED, starts_if_approved)
    metrics.register(SchedulerCollector())
    request_queued.connect(trigger_cycle, dispatch_uid="scheduling.cycle_on_queue")
    health_changed.connect(trigger_cycle, dispatch_uid="scheduling.cycle_on_health")
    node_availability_changed.connect(drain_in_slurm, dispatch_uid="scheduling.drain_in_slurm")
    node_availability_changed.connect(cycle_when_available, dispatch_uid="scheduling.cycle_on_availability")
    backend_availability_changed.connect(cycle_when_available, dispatch_uid="scheduling.cycle_on_backend")
    post_migrate.connect(ensure_schedules, dispatch_uid="scheduling.ensure_schedules")
    _register_approval_subjects()


def _register_approval_subjects() -> None:
    from requests import approvals
    from scheduling.models import IsolationClearance
    from scheduling.services import IsolationClearanceApprovals

    approvals.register_subject(IsolationClearance, IsolationClearanceApprovals())
