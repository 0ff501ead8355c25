"""Reads for pages, the API and the admin."""

from django.db.models import Prefetch

from config.errors import Conflict, NotFound
from config.tokens import secret_hash
from provisioning.choices import RunKind, RunState
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.pipelines import definition_of
from requests.choices import RequestState
from requests.failures import failure_sentence


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
    steps = [_step_data(run, step) for step in run.steps.all()]
    data = {**run_summary(run), "steps": steps}
    if run.failure:  # said as the requester reads it, beside the backend's own words
        label = next((step["label"] for step in steps if step["name"] == run.failure.get("step")), "")
        data["failure"] = {
            **run.failure,
            "sentence": failure_sentence(run.failure.get("code", ""), run.failure.get("step", "")),
            "step_label": label,
        }
    return data


def provisioning_details(request) -> dict | None:
    """The request's runs with their steps (two queries), and what was delivered while it is active."""
    runs = list(
        ProvisioningRun.objects.filter(request=request)
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
    }


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
