"""Provisioning runs: start one per allocation, finish it (the request becomes active or failed), tear down on
release, preemption or failure, retry from the failed step, and take the OS installer's callback.

Executing steps is provisioning/engine.py; what each step does is provisioning/steps.py.
"""

import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from config.errors import Conflict, DomainError, NotFound, NotPermitted
from config.tokens import secret_hash
from provisioning.choices import FORCEABLE_KINDS, Pipeline, RunKind, RunState, StepState
from provisioning.drivers.base import BackendUnavailable, StepError
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.netboot import node_addresses, normalized_address
from provisioning.pipelines import pipeline_for, restart_position, steps_for
from provisioning.selectors import install_wait_refusal
from provisioning.step_tasks import step_task
from requests.choices import EventCode, RequestState
from requests.failures import failure_sentence
from requests.models import ResourceRequest
from requests.services import (
    record_event,
    request_fail,
    request_release,
    request_retry_provisioning,
    requests_activate,
    requests_start_provisioning,
)
from scheduling.allocations import allocations_meter_from_workload
from scheduling.choices import AllocationState
from scheduling.models import RUN_ANCHOR, Allocation
from serving.deployments import deployment_stop
from tenancy.models import User
from tenancy.services import audit_record

logger = logging.getLogger(__name__)


def enqueue_steps(*, step_ids: list[int]) -> None:
    transaction.on_commit(lambda: step_task(step_ids=step_ids))


def _driver_for(pipeline: str, allocation: Allocation) -> str:
    """Bare metal: the BMC driver; anything else: the execution backend of the allocated node."""
    return settings.PROVISIONING_BMC_DRIVER if pipeline == Pipeline.BARE_METAL else allocation.node.execution_backend


@dataclass(frozen=True)
class RunPlan:
    """A run to create: on which allocation of which request, of which kind; a retry's carries the steps before
    `start_at` over (succeeded) from `retry_of`."""

    request: ResourceRequest
    allocation: Allocation
    kind: str
    reason: str = ""
    start_at: int = 0
    retry_of: ProvisioningRun | None = None


def _create_runs(plans: list[RunPlan]) -> list[ProvisioningRun]:
    """The runs with all their steps, in two inserts whatever their number. The caller runs or enqueues their first
    steps (`run.first_step_id`), a batch's together."""
    pipelines = [pipeline_for(plan.request.approved_spec["service"]["kind"]) for plan in plans]
    runs = ProvisioningRun.objects.bulk_create(
        [
            ProvisioningRun(
                request=plan.request,
                allocation=plan.allocation,
                kind=plan.kind,
                pipeline=pipeline,
                driver=_driver_for(pipeline, plan.allocation),
                reason=plan.reason[:300],
                current_position=plan.start_at,
                retry_of=plan.retry_of,
            )
            for plan, pipeline in zip(plans, pipelines, strict=True)
        ]
    )
    steps = ProvisioningStep.objects.bulk_create(
        [step for run, plan in zip(runs, plans, strict=True) for step in _new_steps(run, plan)]
    )
    # What a compute run starts on its backend is charged from its start there (its readiness records it).
    starts_workloads = [run for run in runs if run.pipeline == Pipeline.COMPUTE and run.kind == RunKind.PROVISION]
    allocations_meter_from_workload(allocation_ids=[run.allocation_id for run in starts_workloads])
    for run, plan in zip(runs, plans, strict=True):
        own = [step for step in steps if step.run is run]
        first = next(step for step in own if step.position == plan.start_at)
        run.first_step_id = first.pk if first.pk is not None else run.steps.get(position=plan.start_at).pk
        run.step_count = len(own)
    return runs


def _new_steps(run: ProvisioningRun, plan: RunPlan) -> list[ProvisioningStep]:
    carried = {step.position: step for step in plan.retry_of.steps.all()} if plan.retry_of else {}
    timeouts = settings.PROVISIONING_STEP_TIMEOUTS
    return [
        ProvisioningStep(
            run=run,
            position=position,
            name=definition.name,
            max_attempts=settings.PROVISIONING_MAX_ATTEMPTS,
            timeout_seconds=timeouts.get(definition.name, definition.timeout),
            **_carried_over(carried.get(position)) if position < plan.start_at else {},
        )
        for position, definition in enumerate(steps_for(run.pipeline, plan.kind))
    ]


def _create_and_enqueue(request: ResourceRequest, allocation: Allocation, kind: str, **options) -> ProvisioningRun:
    (run,) = _create_runs([RunPlan(request, allocation, kind, **options)])
    enqueue_steps(step_ids=[run.first_step_id])
    return run


def _carried_over(step: ProvisioningStep) -> dict:
    return {
        "state": StepState.SUCCEEDED,
        "attempts": 0,
        "output": step.output,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "log": f"Carried over from run #{step.run_id}; not run again.",
    }


# --- Start ------------------------------------------------------------------------------------------------


@transaction.atomic
def runs_start(*, request_ids: list[int]) -> list[ProvisioningRun]:
    """Provision each newly allocated request (after the scheduler's commit), in one transaction; safe to call twice.
    The caller runs the runs' first steps (`run.first_step_id`) as one batch, in the order given (the start batches
    keep a node's requests together, in the order of their devices), or enqueues them."""
    locked = ResourceRequest.objects.select_for_update().filter(pk__in=request_ids).order_by("pk")  # no deadlocks
    requests = {request.pk: request for request in locked}
    allocations = {
        allocation.request_id: allocation
        for allocation in Allocation.objects.filter(
            RUN_ANCHOR, request_id__in=request_ids, state=AllocationState.ACTIVE
        ).select_related("node")
    }
    provisioned = set(
        ProvisioningRun.objects.filter(allocation__in=allocations.values(), kind=RunKind.PROVISION).values_list(
            "allocation_id", flat=True
        )
    )
    startable = [
        RunPlan(requests[request_id], allocations[request_id], RunKind.PROVISION)
        for request_id in request_ids
        if _startable(requests.get(request_id), allocations.get(request_id), provisioned)
    ]
    runs = _create_runs(startable)
    requests_start_provisioning(
        started=[
            (
                run.request,
                f"Provisioning started on {run.allocation.node.name}: {run.get_pipeline_display()}, "
                f"{run.step_count} steps ({run.driver} driver).",
                {"run": run.pk, "pipeline": run.pipeline, "driver": run.driver},
            )
            for run in runs
        ]
    )
    return runs


def _startable(request: ResourceRequest | None, allocation: Allocation | None, provisioned: set[int]) -> bool:
    """Allocated, with the active allocation its run would build on, not yet provisioned there, and a pipeline."""
    if request is None or allocation is None or allocation.pk in provisioned or not request.approved_spec:
        return False
    has_pipeline = pipeline_for(request.approved_spec["service"]["kind"]) is not None
    return request.state == RequestState.ALLOCATED and has_pipeline


def runs_start_stranded(*, limit: int = 100) -> dict[str, list[int]]:
    """The sweeper's net under runs_start: a request allocated for longer than the grace period without a
    provisioning run lost its start (a worker died between the scheduler's commit and the task, or the start
    failed). Start it now, or, if it cannot start, release it with the reason, so no allocation is held for ever."""
    cutoff = timezone.now() - timedelta(seconds=settings.PROVISIONING_START_GRACE_SECONDS)
    has_run = ProvisioningRun.objects.filter(
        allocation__request=OuterRef("pk"), kind=RunKind.PROVISION, allocation__state=AllocationState.ACTIVE
    )
    stranded = (
        ResourceRequest.objects.filter(state=RequestState.ALLOCATED, updated_at__lt=cutoff)
        .filter(~Exists(has_run))
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )
    outcome = {"started": [], "released": [], "failed": []}
    for request_id in stranded:
        try:
            outcome[_start_or_release(request_id)].append(request_id)
        except Exception:  # one request that cannot even be released must not keep the sweeper from the others
            logger.exception("Stranded request #%s could neither start nor be released", request_id)
            outcome["failed"].append(request_id)
    return outcome


def _start_or_release(request_id: int) -> str:
    try:
        with transaction.atomic():
            run = next(iter(runs_start(request_ids=[request_id])), None)
            if run is not None:
                enqueue_steps(step_ids=[run.first_step_id])
                record_event(
                    request=run.request,
                    actor=None,
                    code=EventCode.PROVISIONING_RECOVERED,
                    data={"run": run.pk},
                    message="Allocated without a provisioning run for longer than "
                    f"{settings.PROVISIONING_START_GRACE_SECONDS} s: started by the sweeper.",
                )
                return "started"
        reason = {
            "code": "not_startable",
            "message": "It has no active allocation or no approved snapshot to provision from.",
            "details": {},
        }
    except Exception as error:  # whatever broke the start, the devices must go back: release with the reason
        logger.exception("Provisioning of stranded request #%s could not start", request_id)
        reason = {
            "code": "start_failed",
            "message": f"Starting provisioning failed: {type(error).__name__}.",
            "details": {"error": str(error)[:300]},
        }
    return _release_stranded(request_id, reason)


def releases_resume_stranded(*, limit: int = 100) -> list[int]:
    """The sweeper's net under the release's teardown task: a request `releasing` for longer than
    PROVISIONING_RELEASE_GRACE_SECONDS whose allocation is still held with no teardown run lost that task (its worker,
    or its database connection, died between the release's commit and the task). Start it now; `release_start` is
    idempotent, so a late original task changes nothing. Returns the request ids."""
    cutoff = timezone.now() - timedelta(seconds=settings.PROVISIONING_RELEASE_GRACE_SECONDS)
    torn_down = ProvisioningRun.objects.filter(allocation=OuterRef("pk")).exclude(kind=RunKind.PROVISION)
    stranded = list(
        Allocation.objects.filter(
            RUN_ANCHOR,
            state=AllocationState.ACTIVE,
            request__state=RequestState.RELEASING,
            request__updated_at__lt=cutoff,
        )
        .filter(~Exists(torn_down))
        .order_by("request__updated_at")
        .values_list("request_id", flat=True)[:limit]
    )
    for request_id in stranded:
        with transaction.atomic():
            request = ResourceRequest.objects.select_for_update().get(pk=request_id)
            if request.state != RequestState.RELEASING:
                continue
            release_start(request_id=request_id, reason="release resumed by the sweeper")
            record_event(
                request=request,
                actor=None,
                code=EventCode.PROVISIONING_RECOVERED,
                message=f"Releasing for longer than {settings.PROVISIONING_RELEASE_GRACE_SECONDS} s without a "
                "teardown: started by the sweeper.",
                data={},
            )
    return stranded


@transaction.atomic
def _release_stranded(request_id: int, reason: dict) -> str:
    request = ResourceRequest.objects.select_for_update().get(pk=request_id)
    if request.state != RequestState.ALLOCATED:  # it moved on meanwhile (started, released): nothing to do
        return "started" if request.state == RequestState.PROVISIONING else "released"
    message = f"Provisioning could not start: {reason['message']} Releasing the allocation."
    record_event(request=request, actor=None, code=EventCode.PROVISIONING_NOT_STARTED, message=message, data=reason)
    request_release(request=request, actor=None, reason=message)
    return "released"


# --- Finish -----------------------------------------------------------------------------------------------


def runs_succeeded(*, finished: list[tuple[ProvisioningRun, dict]]) -> None:
    """Called by the engine inside the transaction that records the runs' last steps (run, its last step's output):
    the provisioning runs among them activate their requests together, on one locked read of those requests. The
    runs are saved in one UPDATE: the record holds their locks and has seen each one running, so a save's guard on
    the state it was read in (ConcurrentTransitionMixin) has nothing to add."""
    for run, last_output in finished:
        run.succeed(delivered=last_output if run.kind == RunKind.PROVISION else None)
    ProvisioningRun.objects.bulk_update([run for run, _ in finished], ["state", "finished_at", "delivered"])
    provisioned = [(run, last_output) for run, last_output in finished if run.kind == RunKind.PROVISION]
    _activate(provisioned)
    for run, _ in finished:
        if run.kind not in (RunKind.PROVISION, RunKind.RELEASE):  # a release's last step finished the release
            record_event(
                request=run.request,
                actor=None,
                code=EventCode.CLEANED_UP,
                message=f"Cleaned up after the {'preemption' if run.kind == RunKind.TEARDOWN else 'failure'}: "
                f"{', '.join(_step_labels(run))}.",
                data={"run": run.pk},
            )


def _activate(provisioned: list[tuple[ProvisioningRun, dict]]) -> None:
    """Each request whose run delivered it and that is still provisioning (not when a release overtook it)."""
    locked = ResourceRequest.objects.select_for_update().filter(pk__in=[run.request_id for run, _ in provisioned])
    requests = {request.pk: request for request in locked.order_by("pk")}  # pk order: no deadlocks
    for run, _ in provisioned:
        run.request = requests[run.request_id]
    requests_activate(
        activated=[
            (
                run.request,
                last_output,
                f"Active: delivered on {last_output['node']} ({last_output['host']}) after {run.current_position} "
                "steps.",
                {"run": run.pk},
            )
            for run, last_output in provisioned
            if run.request.state == RequestState.PROVISIONING
        ]
    )


def _request_still(run: ProvisioningRun, state: str) -> bool:
    return ResourceRequest.objects.select_for_update().get(pk=run.request_id).state == state


def _step_labels(run: ProvisioningRun) -> list[str]:
    definitions = steps_for(run.pipeline, run.kind)
    return [definitions[position].label for position in run.steps.values_list("position", flat=True)]


def run_failed(*, run: ProvisioningRun, step: ProvisioningStep, error: StepError) -> None:
    """Called by the engine inside the transaction that records the step's final failure."""
    failure = {
        "step": step.name,
        "code": error.code,
        "message": error.message,
        "attempts": step.attempts,
        "details": error.details,
    }
    run.fail(failure=failure)
    run.save(update_fields=["state", "finished_at", "failure"])
    isolated = _isolate_if_needed(run, step, error)
    if run.kind != RunKind.PROVISION:
        _teardown_stuck(run, step, error, isolated)
        return
    request = run.request
    # In the requester's words; the backend's own (error.message) stays in the failure, for operators.
    label = steps_for(run.pipeline, run.kind)[step.position].label
    attempts = f"{step.attempts} attempt{'s' if step.attempts != 1 else ''}"
    message = f"Provisioning failed at “{label}” after {attempts}: {failure_sentence(error.code, step.name)}" + (
        f" Node {run.allocation.node.name} isolated for an operator." if isolated else ""
    )
    if _request_still(run, RequestState.PROVISIONING):
        request_fail(request=request, failure=failure, message=message, data={"run": run.pk})
        _create_and_enqueue(request, run.allocation, RunKind.CLEANUP, reason=f"provisioning failed at “{label}”")
    else:  # a release overtook it, and its teardown cleans up
        record_event(
            request=request,
            actor=None,
            code=EventCode.PROVISIONING_STEP_FAILED,
            message=message,
            data={"run": run.pk, "failure": failure},
        )


def _teardown_stuck(run: ProvisioningRun, step: ProvisioningStep, error: StepError, isolated: bool) -> None:
    """A teardown failed for good (the backend refused, not an outage, which a teardown waits out): the workload may
    still run, so its devices stay held (a preemption's were taken back already) and the request keeps its state (a
    release stays `releasing`) until an operator confirms the workload is gone (`teardown_force`, audited)."""
    held = run.kind != RunKind.TEARDOWN
    label = steps_for(run.pipeline, run.kind)[step.position].label
    record_event(
        request=run.request,
        actor=None,
        code=EventCode.TEARDOWN_STUCK,
        message=f"{run.get_kind_display()} failed at “{label}”: {failure_sentence(error.code, step.name)}"
        + (f" Node {run.allocation.node.name} isolated for an operator." if isolated else "")
        + (" The devices stay held until an operator confirms the workload is gone." if held else ""),
        data={"run": run.pk, "failure": run.failure},
    )


# Failures of the platform itself, not findings about the node the step acted on.
PLATFORM_FAILURES = frozenset({"worker_lost", "internal_error"})


def run_placement_lost(*, run: ProvisioningRun, step: ProvisioningStep, reason: dict) -> None:
    """Called by the engine inside the transaction that records the step (its run locked): the backend will not
    start the work on the node it was placed on (a drained Slurm node). Nothing runs there yet, so the run stops, the
    request gives its devices back and returns to the queue with the backend's reason on its timeline, and a cycle
    places it again; the teardown that follows the requeue cancels whatever the run had submitted. Never a failure,
    and no cordon of ours: the backend's own state is the inventory's (the driver has applied it)."""
    from scheduling.reclaim import requests_requeue

    _cancel_run(run)
    request = ResourceRequest.objects.select_for_update().get(pk=run.request_id)
    if request.state != RequestState.PROVISIONING:  # a release or cancellation overtook it: nothing to place
        return
    requests_requeue(
        requests=[request],
        reason=f"placed again: {reason['message']}"[:300],
        message=f"{reason['message']} Back in the queue, to be placed again where it can run.",
        data={**reason, "run": run.pk, "step": step.name},
    )


def _isolate_if_needed(run: ProvisioningRun, step: ProvisioningStep, error: StepError) -> bool:
    """Only findings about the node keep new work off it until an operator looks: hardware the step found wrong
    (`isolate` in its details), or a teardown the backend refused for that node. An outage is never one: it is
    waited out (outages.py), and a provisioning step that outlasts its budget fails without isolating."""
    from scheduling.services import node_cordon

    teardown_refused = (
        run.kind != RunKind.PROVISION
        and not isinstance(error, BackendUnavailable)
        and error.code not in PLATFORM_FAILURES
    )
    if not (error.details.get("isolate") or teardown_refused):
        return False
    with contextlib.suppress(Conflict):  # already cordoned, for this or another reason: it stays so
        node_cordon(
            node=run.allocation.node,
            reason=f"Isolated by provisioning run #{run.pk} (request #{run.request_id}) at "
            f"step '{step.name}': {error.message}",
            actor=None,
        )
    return True


# --- Tear down --------------------------------------------------------------------------------------------


def _cancel_provisioning(allocation_id: int) -> None:
    """Stop a provisioning run that is still going; an in-flight step's worker sees it and discards its result."""
    for run in ProvisioningRun.objects.select_for_update().filter(
        allocation_id=allocation_id, kind=RunKind.PROVISION, state=RunState.RUNNING
    ):
        _cancel_run(run)


def _cancel_run(run: ProvisioningRun) -> None:
    run.cancel()
    run.save(update_fields=["state", "finished_at"])
    for step in run.steps.select_for_update().filter(state__in=[StepState.PENDING, StepState.WAITING]):
        step.cancel()
        step.save(update_fields=["state", "finished_at", "lease_owner", "lease_expires_at"])


class ReleasePath(StrEnum):
    TEAR_DOWN = "tear_down"  # what provisioning built is torn down; the teardown's last step frees the devices
    FREE_NOW = "free_now"  # nothing was built (released while only allocated, or made active elsewhere)


def _teardown_anchor(request_id: int, kind: str) -> Allocation | None:
    """The allocation a teardown of `kind` runs on: the one running now, or after a preemption the latest released
    one (the scheduler has already released it, and may have placed the request anew)."""
    state = AllocationState.RELEASED if kind == RunKind.TEARDOWN else AllocationState.ACTIVE
    return (
        Allocation.objects.filter(RUN_ANCHOR, request_id=request_id, state=state)
        .order_by("-started_at", "-id")
        .select_related("request")
        .first()
    )


def _built_on(allocation: Allocation | None) -> bool:
    return allocation is not None and allocation.provisioning_runs.filter(kind=RunKind.PROVISION).exists()


def release_path(*, request_id: int) -> ReleasePath:
    """How a release goes, decided here and nowhere else: provisioning started from `allocated` in the same
    transaction that made its run, so a provisioning run on the request's allocation means something was built,
    which is torn down before the devices go back; no run means nothing to tear down, and they go back at once."""
    return ReleasePath.TEAR_DOWN if _built_on(_teardown_anchor(request_id, RunKind.RELEASE)) else ReleasePath.FREE_NOW


@transaction.atomic
def release_start(*, request_id: int, reason: str) -> ProvisioningRun | None:
    """The one entry of every release (request_releasing's one receiver, and the sweeper of lost ones): tear down
    then free, or free now (release_path). Returns the release run; None when the devices were freed at once or its
    teardown has begun already (a second delivery of the same signal)."""
    from scheduling.reclaim import allocation_free

    if release_path(request_id=request_id) == ReleasePath.FREE_NOW:
        deployment_stop(request=request_id)  # an endpoint at zero replicas runs nothing, but its route goes
        allocation_free(request_ids=[request_id], reason=reason)
        return None
    return _teardown_begin(_teardown_anchor(request_id, RunKind.RELEASE), RunKind.RELEASE, reason)


@transaction.atomic
def teardown_start(*, request_id: int, reason: str, kind: str) -> ProvisioningRun | None:
    """Tear down what provisioning built on the request's allocation, for a preemption (the devices were freed
    already) or the cleanup of a workload that ended by itself; releases go through release_start. None when its
    teardown has begun or nothing was built there."""
    if kind == RunKind.RELEASE:
        raise ValueError("A release is decided by release_start.")
    allocation = _teardown_anchor(request_id, kind)
    return _teardown_begin(allocation, kind, reason) if _built_on(allocation) else None


def _teardown_begin(allocation: Allocation, kind: str, reason: str) -> ProvisioningRun | None:
    if allocation.provisioning_runs.exclude(kind=RunKind.PROVISION).exists():
        return None
    _cancel_provisioning(allocation.pk)
    return _create_and_enqueue(allocation.request, allocation, kind, reason=reason)


def teardown_after_preemption(*, request_id: int) -> ProvisioningRun | None:
    return teardown_start(request_id=request_id, reason="preempted", kind=RunKind.TEARDOWN)


# --- An operator confirms a workload is gone ------------------------------------------------------------------


def can_force_release(user: User) -> bool:
    return user.has_perm("provisioning.force_release_provisioningrun")


def teardown_forceable(run: ProvisioningRun) -> bool:
    """A release or cleanup that has not returned its devices: failed for good, or still waiting for its backend."""
    return run.kind in FORCEABLE_KINDS and run.state in (RunState.RUNNING, RunState.FAILED)


@transaction.atomic
def teardown_force(*, run: ProvisioningRun, actor: User, reason: str) -> ProvisioningRun:
    """An operator confirms that the workload of a teardown the backend never confirmed is gone (a node reinstalled,
    a Slurm cluster given up): the teardown stops where it is, the devices go back to the pool and a release ends
    `released`. Audited, and on the request's timeline."""
    from scheduling.reclaim import allocation_free

    if not can_force_release(actor):
        raise NotPermitted("Only operators can return the capacity of a teardown.")
    if not reason.strip():
        raise DomainError("Give a reason; it goes on the request's timeline.", code="reason_required")
    run = ProvisioningRun.objects.select_for_update().get(pk=run.pk)
    if not teardown_forceable(run) or run.allocation.state != AllocationState.ACTIVE:
        raise Conflict(
            "Only a release or cleanup that has not returned its devices can be forced.",
            code="not_forceable",
            details={"run": run.pk, "kind": run.kind, "state": run.state},
        )
    if run.state == RunState.RUNNING:
        _cancel_run(run)
    message = f"{actor.username} confirmed the workload is gone and returned the devices: {reason}"
    record_event(
        request=run.request, actor=actor, code=EventCode.TEARDOWN_FORCED, message=message, data={"run": run.pk}
    )
    allocation_free(request_ids=[run.request_id], reason=f"forced by {actor.username}: {reason}"[:300])
    audit_record(
        actor=actor,
        action="provisioning.teardown_forced",
        target=run,
        reason=reason,
        data={"request": run.request_id, "allocation": run.allocation_id, "run_state": run.state},
    )
    return run


# --- Retry ------------------------------------------------------------------------------------------------


def can_retry(user: User) -> bool:
    return user.has_perm("provisioning.retry_provisioningrun")


@transaction.atomic
def run_retry(*, run: ProvisioningRun, actor: User, reason: str) -> ProvisioningRun:
    """An operator retries a failed provisioning on the same devices, from the failed step (or from the first
    earlier step whose effect the failure cleanup undid). Audited; counts as a manual intervention."""
    from scheduling.reclaim import allocation_rebind

    if not can_retry(actor):
        raise NotPermitted("Only operators can retry provisioning.")
    if not reason.strip():
        raise DomainError("Give a reason; it goes on the request's timeline.", code="reason_required")
    run = ProvisioningRun.objects.select_for_update().get(pk=run.pk)
    request = ResourceRequest.objects.select_for_update().get(pk=run.request_id)
    _check_retryable(run, request)
    allocation = allocation_rebind(allocation=run.allocation)
    failed = run.steps.get(name=run.failure["step"])
    start_at = restart_position(run.pipeline, failed.position)
    retry = _create_and_enqueue(request, allocation, RunKind.PROVISION, start_at=start_at, retry_of=run)
    restart_name = retry.steps.get(position=start_at).name
    request_retry_provisioning(
        request=request,
        actor=actor,
        reason=reason,
        message=f"Provisioning retried by {actor.username} from step '{restart_name}' "
        f"(failed at '{failed.name}'): {reason}",
        data={"run": retry.pk, "retry_of": run.pk, "from_step": restart_name},
    )
    audit_record(
        actor=actor,
        action="provisioning.retried",
        target=run,
        reason=reason,
        data={"request": request.pk, "new_run": retry.pk, "from_step": restart_name},
    )
    return retry


def _check_retryable(run: ProvisioningRun, request: ResourceRequest) -> None:
    if run.kind != RunKind.PROVISION or run.state != RunState.FAILED:
        raise Conflict(
            "Only a failed provisioning run can be retried.",
            code="not_retryable",
            details={"run": run.pk, "kind": run.kind, "state": run.state},
        )
    if request.state != RequestState.FAILED or run.retries.exists():
        raise Conflict(
            f"Request #{request.pk} is {request.state}; only its latest failed run can be retried.",
            code="not_retryable",
            details={"request_state": request.state},
        )
    if run.allocation.provisioning_runs.filter(kind=RunKind.CLEANUP, state=RunState.RUNNING).exists():
        raise Conflict(
            "The cleanup after the failure is still running; retry when it has finished.",
            code="cleanup_in_progress",
            details={"run": run.pk},
        )


# --- The OS installer's callback --------------------------------------------------------------------------


@transaction.atomic
def installer_report(*, token: str, status: str, detail: str = "", source_address: str | None) -> ProvisioningRun:
    """The installer reports the install done or failed. Taken only with the run's token, from the node's address
    when the platform knows it (`source_address`: where the report came from; None: from the node itself, the
    simulated installer), and only while the run waits for it; any refusal changes nothing."""
    run = (
        ProvisioningRun.objects.select_for_update(of=("self",))
        .select_related("allocation__node")
        .filter(installer_token_hash=secret_hash(token or ""))
        .first()
    )
    if run is None or not token:
        raise NotFound("Unknown installer token.", code="unknown_token")
    _check_from_node(run, source_address)
    if refusal := install_wait_refusal(run):
        raise refusal
    run.installer_reported_at, run.installer_report = timezone.now(), {"status": status, "detail": detail[:2000]}
    run.save(update_fields=["installer_reported_at", "installer_report"])
    waiting = run.steps.filter(name="wait_for_install")
    waiting.filter(state=StepState.WAITING).update(retry_at=run.installer_reported_at)  # due now, not at next poll
    enqueue_steps(step_ids=list(waiting.values_list("pk", flat=True)))
    return run


def _check_from_node(run: ProvisioningRun, source_address: str | None) -> None:
    known = node_addresses(run.allocation.node.os_address)
    if source_address is None or not known:
        return
    try:
        source = normalized_address(source_address)
    except ValueError:
        source = source_address
    if source not in known:
        raise NotPermitted(
            "An installer reports from its server's own address.",
            code="not_from_node",
            details={"address": source},
        )
