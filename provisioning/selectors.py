"""Reads for pages, the API and the admin."""

from django.db.models import Prefetch

from config.errors import Conflict, NotFound
from config.tokens import secret_hash
from provisioning import outages
from provisioning.choices import FORCEABLE_KINDS, RunKind, RunState, StepState
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.pipelines import definition_of
from requests.choices import RequestState
from scheduling.choices import AllocationState


def _step_data(run: ProvisioningRun, step: ProvisioningStep) -> dict:
    return {
        "position": step.position,
        "name": step.name,
        "label": definition_of(run.pipeline, run.kind, step.position).label,
        "state": step.state,
        "attempts": step.attempts,
        "max_attempts": step.max_attempts,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "duration_seconds": step.duration_seconds,
        "log": step.log,
        "output": step.output,
        "error": step.error or None,
    }


def run_summary(run: ProvisioningRun) -> dict:
    return {
        "id": run.pk,
        "kind": run.kind,
        "state": run.state,
        "pipeline": run.pipeline,
        "driver": run.driver,
        "reason": run.reason,
        "failure": run.failure or None,
        "retry_of": run.retry_of_id,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
    }


def _run_data(run: ProvisioningRun) -> dict:
    return {**run_summary(run), "steps": [_step_data(run, step) for step in run.steps.all()]}


def provisioning_details(request) -> dict | None:
    """The request's runs with their steps (two queries), what was delivered while it is active, and why it waits
    for its backend (an outage, or a teardown the backend refused) while it does."""
    runs = list(
        ProvisioningRun.objects.filter(request=request)
        .select_related("allocation")
        .order_by("created_at", "id")
        .prefetch_related(Prefetch("steps", queryset=ProvisioningStep.objects.order_by("position")))
    )
    if not runs:
        return None
    delivered = next(
        (run.delivered for run in reversed(runs) if run.kind == RunKind.PROVISION and run.state == RunState.SUCCEEDED),
        None,
    )
    return {
        "runs": [_run_data(run) for run in runs],
        "delivered": delivered if request.state == RequestState.ACTIVE else None,
        "waiting": _waiting(runs[-1]),
    }


OUTAGE_STATES = (StepState.WAITING, StepState.RUNNING)


def _waiting(run: ProvisioningRun) -> dict | None:
    """The latest run's wait for its backend: its current step waiting out an outage, or a teardown that failed
    for good with its devices still held."""
    if run.state == RunState.RUNNING:
        current = next((step for step in run.steps.all() if step.position == run.current_position), None)
        if current is not None and current.outage_since is not None and current.state in OUTAGE_STATES:
            return outages.waiting_reason(run, current)  # waiting for its next try, or trying again now
    if run.state == RunState.FAILED and run.kind in FORCEABLE_KINDS and run.allocation.state == AllocationState.ACTIVE:
        return outages.stuck_reason(run)
    return None


def installer_run(token: str) -> ProvisioningRun:
    """The run whose installer holds this token, while it may still use it (the network boot files are fetched
    with it): 404 for a token no run holds, 409 once the installer has reported or the run has stopped."""
    run = (
        ProvisioningRun.objects.select_related("request__requester", "allocation__node")
        .filter(installer_token_hash=secret_hash(token or ""))
        .first()
    )
    if run is None or not token:
        raise NotFound("Unknown installer token.", code="unknown_token")
    if run.installer_reported_at is not None:
        raise Conflict("This installer token has already been used.", code="token_used")
    if run.state != RunState.RUNNING:
        raise Conflict(f"The provisioning run is {run.state}.", code="token_expired", details={"state": run.state})
    return run
