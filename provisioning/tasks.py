"""django-q2 entry points: take ids, call one service."""

import logging
import time

from django_q.tasks import async_task

from config.errors import DomainError
from config.retry import retry_if_locked
from config.workers import wait_unless_stopping
from provisioning import engine, extensions, outages, reconcile, scaling, services

logger = logging.getLogger(__name__)


@retry_if_locked
def run_step(step_ids: list[int] | int) -> None:
    """A batch of runs' current steps (one step id: a task enqueued before steps went in batches)."""
    engine.steps_execute(step_ids=[step_ids] if isinstance(step_ids, int) else step_ids)


@retry_if_locked
def start_runs(request_ids: list[int]) -> int:
    """The runs of a batch of newly allocated requests, and then, in this same task, their steps (a trip through
    the broker saved)."""
    runs = services.runs_start(request_ids=request_ids)
    if runs:
        engine.steps_execute(step_ids=[run.first_step_id for run in runs])
    return len(runs)


@retry_if_locked
def start_stranded_runs() -> dict[str, list[int]]:
    return {
        **services.runs_start_stranded(),
        "releases_resumed": services.releases_resume_stranded(),
        "scale_downs_resumed": scaling.scale_downs_resume(),
    }


@retry_if_locked
def start_release(request_id: int, reason: str) -> bool:
    """Tear down then free, or free now (services.release_start); True when a release run started."""
    return services.release_start(request_id=request_id, reason=reason) is not None


@retry_if_locked
def scale_to_zero(request_id: int, reason: str) -> dict:
    return scaling.endpoint_scale_to_zero(request_id=request_id, reason=reason)


@retry_if_locked
def teardown_after_preemption(request_id: int) -> bool:
    return services.teardown_after_preemption(request_id=request_id) is not None


@retry_if_locked
def extend_workload(request_id: int) -> str:
    return extensions.workload_extend(request_id=request_id)


@retry_if_locked
def resume_due_steps() -> int:
    return engine.steps_resume_due()


@retry_if_locked
def reconcile_workloads() -> dict[int, str]:
    return reconcile.workloads_reconcile()


@retry_if_locked
def watch_backend(backend: str) -> str:
    return outages.backend_watch(backend=backend)


@retry_if_locked
def wake_steps(backend: str) -> int:
    return outages.steps_wake(backend=backend)


@retry_if_locked
def simulated_installer(node: str, seconds: float) -> None:
    """The simulated OS installer of the node's virtual media: it installs for a while, then reports to the callback
    like a real one, with the token its media URL carries. A stopping worker hands the rest of the installation to
    another one."""
    from provisioning.drivers.simulated import simulated_installer_token

    started = time.monotonic()
    if wait_unless_stopping(seconds):
        async_task("provisioning.tasks.simulated_installer", node, max(0.0, seconds - (time.monotonic() - started)))
        return
    token = simulated_installer_token(node)
    if not token:  # the media was ejected meanwhile (the run was released)
        return
    try:
        services.installer_report(
            token=token, status="succeeded", detail="Simulated installer finished.", source_address=None
        )
    except DomainError as refused:  # as a real installer's report would be: the run no longer waits for it
        logger.info("The simulated installer of %s was refused: %s", node, refused.code)
