"""Reads for pages, the API and the admin."""

from django.db.models import Exists, OuterRef, Prefetch, QuerySet

from catalog.choices import BootMethod
from config.errors import Conflict, NotFound
from provisioning import outages
from provisioning.choices import FORCEABLE_KINDS, RunKind, RunState, StepState
from provisioning.ide import ide_access
from provisioning.models import UNFINISHED_STEP_STATES, ProvisioningRun, ProvisioningStep
from provisioning.netboot import node_addresses, normalized_address
from provisioning.pipelines import definition_of
from requests.choices import RequestState
from requests.failures import failure_sentence
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
    if delivered is not None and request.state == RequestState.ACTIVE:
        ide = ide_access(request_id=request.pk, delivered=delivered)
        delivered = {**delivered, **({"ide": ide} if ide else {})}
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


def runs_awaiting_install() -> QuerySet[ProvisioningRun]:
    """Provisioning runs that wait for their OS installer: still running, the installer booted (its boot step done,
    so its token handed out), not yet reported, and their wait for it not over."""
    steps = ProvisioningStep.objects.filter(run=OuterRef("pk"))
    return ProvisioningRun.objects.filter(
        Exists(steps.filter(name="boot_installer", state=StepState.SUCCEEDED)),
        Exists(steps.filter(name="wait_for_install", state__in=UNFINISHED_STEP_STATES)),
        kind=RunKind.PROVISION,
        state=RunState.RUNNING,
        installer_reported_at__isnull=True,
    ).exclude(installer_token_nonce="")


def install_wait_refusal(run: ProvisioningRun) -> Conflict | None:
    """Why the run takes no installer report now (409), or None while it waits for one."""
    if run.installer_reported_at is not None:
        return Conflict("This installer token has already been used.", code="token_used")
    if run.state != RunState.RUNNING:
        return Conflict(f"The provisioning run is {run.state}.", code="token_expired", details={"state": run.state})
    states = dict(run.steps.filter(name__in=["boot_installer", "wait_for_install"]).values_list("name", "state"))
    if states.get("boot_installer") != StepState.SUCCEEDED:
        return Conflict(
            "The run has not booted its installer yet: no installer can have reported.",
            code="install_not_started",
            details={"boot_installer": states.get("boot_installer")},
        )
    if states.get("wait_for_install") not in UNFINISHED_STEP_STATES:
        return Conflict(
            "The run no longer waits for its installer.",
            code="token_expired",
            details={"wait_for_install": states.get("wait_for_install")},
        )
    return None


def network_install_run(address: str) -> ProvisioningRun:
    """The run waiting to install, over the network, the node at this address (the caller's): 404 when none does."""
    try:
        address = normalized_address(address)
    except ValueError:
        address = ""
    waiting = (
        runs_awaiting_install()
        .filter(request__approved_spec__bare_metal_profile__boot_method=BootMethod.PXE)
        .exclude(allocation__node__os_address="")
        .select_related("request__requester", "allocation__node")
    )
    found = [run for run in waiting if address and address in node_addresses(run.allocation.node.os_address)]
    if not found:
        raise NotFound(
            "No server at this address is waiting to install its OS over the network.",
            code="no_install_waiting",
            details={"address": address},
        )
    if len(found) > 1:
        raise Conflict(
            "Several servers waiting to install are recorded at this address: an operator gives each its own.",
            code="address_ambiguous",
            details={"address": address},
        )
    return found[0]
