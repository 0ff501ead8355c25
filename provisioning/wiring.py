"""What starts provisioning work: the requests' and scheduling's signals, the sweeper schedule, metrics."""

from collections import defaultdict

from django.conf import settings
from django.db.models import Min
from django_q.tasks import async_task

from config import schedules
from provisioning.outages import WAKE_TASK, WATCH_TASK
from scheduling.choices import AllocationState
from scheduling.models import RUN_ANCHOR, Allocation

SWEEP_TASK = "provisioning.tasks.resume_due_steps"
STRANDED_TASK = "provisioning.tasks.start_stranded_runs"
RECONCILE_TASK = "provisioning.tasks.reconcile_workloads"
RELEASE_TASK = "provisioning.tasks.start_release"
SCALE_TO_ZERO_TASK = "provisioning.tasks.scale_to_zero"


# At most this many start tasks per cycle: a cycle that placed a few requests gets one task per batch, and one that
# placed ten thousand enqueues this many (with larger batches), so the cycle's enqueues do not grow with what it
# placed while every worker still gets a share.
START_TASKS_PER_CYCLE = 64


def start_runs(*, request_ids: list[int], **_kwargs) -> None:
    """Start tasks of about PROVISIONING_START_BATCH requests, at most START_TASKS_PER_CYCLE of them: a cycle that
    placed hundreds starts their runs on several workers at once, and each batch's runs then go through their steps
    together (provisioning/engine.py). A node's requests are never split between batches and come in the order of
    the devices chosen for them there: a backend that binds devices itself (Slurm gives the job it starts first the
    node's lowest free GPUs) then sees a node's work in that order, from one worker."""
    by_node = _by_node_in_device_order(request_ids)
    size = max(settings.PROVISIONING_START_BATCH, -(-len(request_ids) // START_TASKS_PER_CYCLE), 1)
    batch = []
    for node_requests in by_node:
        batch += node_requests
        if len(batch) >= size:
            async_task("provisioning.tasks.start_runs", batch)
            batch = []
    if batch:
        async_task("provisioning.tasks.start_runs", batch)


def _by_node_in_device_order(request_ids: list[int]) -> list[list[int]]:
    placed = (
        Allocation.objects.filter(RUN_ANCHOR, request_id__in=request_ids, state=AllocationState.ACTIVE)
        .annotate(first_device=Min("devices__device__index"))
        .order_by("node_id", "first_device", "request_id")
        .values_list("node_id", "request_id")
    )
    by_node = defaultdict(list)
    for node_id, request_id in placed:
        by_node[node_id].append(request_id)
    seen = {request_id for requests in by_node.values() for request_id in requests}
    unplaced = [[request_id] for request_id in request_ids if request_id not in seen]  # none, normally
    return [*by_node.values(), *unplaced]


def start_release(*, request_id: int, reason: str, **_kwargs) -> None:
    """request_releasing's one receiver: a task decides the release (provisioning.services.release_start)."""
    async_task(RELEASE_TASK, request_id, reason)


def scale_to_zero(*, request_id: int, reason: str, **_kwargs) -> None:
    """metering's idle sweep acted on an endpoint whose policy scales it to zero."""
    async_task(SCALE_TO_ZERO_TASK, request_id, reason)


def teardown_after_preemption(*, request_id: int, **_kwargs) -> None:
    async_task("provisioning.tasks.teardown_after_preemption", request_id)


def follow_backend(*, backend: str, available: bool, **_kwargs) -> None:
    """A whole backend stopped answering: one task asks it again until it does. It answers again: the steps that
    waited for it go on now, not at their next retry."""
    async_task(WAKE_TASK if available else WATCH_TASK, backend)


def extend_after_approval(*, request_id: int, **_kwargs) -> None:
    """The end the backend enforces (a Slurm job's time limit) moves with an approved extension."""
    async_task("provisioning.tasks.extend_workload", request_id)


def ensure_schedules(**_kwargs) -> None:
    """Every minute: resume steps back from a wait or whose worker died; start (or release) allocations whose
    provisioning never started, and go on with releases and scale-downs that stalled; settle workloads that ended
    by themselves on their backend (a finished Slurm job)."""
    schedules.ensure(
        ("Resume provisioning steps", SWEEP_TASK, schedules.EVERY_MINUTE),
        ("Start stranded provisioning", STRANDED_TASK, schedules.EVERY_MINUTE),
        ("Reconcile workloads with their backends", RECONCILE_TASK, schedules.EVERY_MINUTE),
    )


def connect() -> None:
    from django.db.models.signals import post_migrate

    from config import metrics
    from metering.idle.signals import idle_scale_to_zero
    from provisioning.connect import connect_secrets_shown
    from provisioning.metrics import ProvisioningCollector
    from provisioning.selectors import provisioning_details
    from requests import hooks as request_hooks
    from requests.signals import request_extended, request_preempted, request_releasing
    from scheduling.signals import backend_availability_changed, requests_allocated

    request_hooks.register(request_hooks.PROVISIONING_DETAILS, provisioning_details)
    request_hooks.register(request_hooks.CONNECT_SECRETS, connect_secrets_shown)
    metrics.register(ProvisioningCollector())
    requests_allocated.connect(start_runs, dispatch_uid="provisioning.start_on_allocation")
    request_releasing.connect(start_release, dispatch_uid="provisioning.release")
    request_preempted.connect(teardown_after_preemption, dispatch_uid="provisioning.teardown_on_preemption")
    request_extended.connect(extend_after_approval, dispatch_uid="provisioning.extend_on_approval")
    idle_scale_to_zero.connect(scale_to_zero, dispatch_uid="provisioning.scale_to_zero_when_idle")
    backend_availability_changed.connect(follow_backend, dispatch_uid="provisioning.follow_backend")
    post_migrate.connect(ensure_schedules, dispatch_uid="provisioning.ensure_schedules")
