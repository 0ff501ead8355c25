"""What starts provisioning work: scheduling's signals and hooks, the sweeper schedule, metrics."""

from django_q.tasks import async_task

from config import schedules

SWEEP_TASK = "provisioning.tasks.resume_due_steps"
REPLICA_CHECK_TASK = "provisioning.tasks.check_replicas"
STRANDED_TASK = "provisioning.tasks.start_stranded_runs"
RECONCILE_TASK = "provisioning.tasks.reconcile_workloads"


def start_runs(*, request_ids: list[int], **_kwargs) -> None:
    async_task("provisioning.tasks.start_runs", request_ids)


def teardown_after_preemption(*, request_id: int, **_kwargs) -> None:
    async_task("provisioning.tasks.teardown_after_preemption", request_id)


def ensure_schedules(**_kwargs) -> None:
    """Every minute: resume steps back from a wait or whose worker died; start (or release) allocations whose
    provisioning never started; health-check serving replicas; settle workloads that ended by themselves on their
    backend (a finished Slurm job)."""
    schedules.ensure(
        ("Resume provisioning steps", SWEEP_TASK, schedules.EVERY_MINUTE),
        ("Start stranded provisioning", STRANDED_TASK, schedules.EVERY_MINUTE),
        ("Health-check serving replicas", REPLICA_CHECK_TASK, schedules.EVERY_MINUTE),
        ("Reconcile workloads with their backends", RECONCILE_TASK, schedules.EVERY_MINUTE),
    )


def connect() -> None:
    from django.db.models.signals import post_migrate

    from config import metrics
    from provisioning.metrics import ProvisioningCollector
    from provisioning.selectors import provisioning_details
    from provisioning.services import teardown_start
    from provisioning.serving.selectors import endpoint_details
    from requests import hooks as request_hooks
    from requests.signals import request_preempted
    from scheduling import hooks as scheduling_hooks
    from scheduling.signals import requests_allocated

    request_hooks.register(request_hooks.PROVISIONING_DETAILS, provisioning_details)
    request_hooks.register(request_hooks.ENDPOINT_DETAILS, endpoint_details)
    scheduling_hooks.release_teardown = teardown_start
    metrics.register(ProvisioningCollector())
    requests_allocated.connect(start_runs, dispatch_uid="provisioning.start_on_allocation")
    request_preempted.connect(teardown_after_preemption, dispatch_uid="provisioning.teardown_on_preemption")
    post_migrate.connect(ensure_schedules, dispatch_uid="provisioning.ensure_schedules")
