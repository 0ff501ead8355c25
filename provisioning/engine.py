"""Executing steps, crash-safe.

A worker claims the run's current step under a short lease (row lock, attempt counted), runs the handler outside any
transaction while a heartbeat renews the lease, and records the outcome only if the lease is still its own. A worker
that dies mid-step stops renewing, so its lease expires within PROVISIONING_LEASE_SECONDS; the minute sweeper (or the
next event) hands the step to another worker, which runs it again (handlers are idempotent). The heartbeat renews no
further than the attempt's timeout, so a hung attempt is taken over the same way. Completed steps are never run
again: the run's current position only moves forward.
"""

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from config.workers import stopping, wait_unless_stopping
from provisioning import services
from provisioning.choices import RunState, StepState, Wait
from provisioning.drivers.base import StepError, StepPending
from provisioning.models import ProvisioningStep
from provisioning.pipelines import definition_of
from provisioning.services import step_task
from provisioning.steps import StepContext
from provisioning.targets import run_target
from requests.choices import EventCode
from requests.services import record_event
from scheduling import mig_services

logger = logging.getLogger(__name__)

LOG_LIMIT = 4000


@dataclass
class Done:
    output: dict


@dataclass
class Waiting:
    seconds: float
    message: str


@dataclass
class Following:
    """The run's next step, pending once the step before it was recorded."""

    step_id: int
    polls: bool  # it waits for something that happens elsewhere (a Slurm job starting)


def step_execute(*, step_id: int) -> None:
    """The task body: attempt until the step is finished, or waits longer than a worker should sleep, or belongs
    to another worker, or the worker is stopping. A finished step's successor is run next by the same worker while
    the chain's budget lasts: a request goes through its pipeline at once instead of queueing behind every other
    request's current step, and the broker carries one task per run instead of one per step."""
    chain_ends = time.monotonic() + settings.PROVISIONING_CHAIN_SECONDS
    while True:
        owner = uuid.uuid4()
        claimed = _claim(step_id, owner)
        if claimed is None:
            return
        step, deadline = claimed
        with _Heartbeat(step_id, owner, deadline):
            outcome = _attempt(step)
        then = _record(step_id, owner, outcome)
        if isinstance(then, Following):
            # A polling step goes round the broker: the time other runs' steps take there is time its workload
            # needs to come up anyway, and this worker is not held watching it.
            if then.polls or stopping() or time.monotonic() >= chain_ends:
                step_task(then.step_id)  # the rest of the run goes back to the broker
                return
            step_id = then.step_id
            continue
        if then is None or then > settings.PROVISIONING_INLINE_WAIT_SECONDS:
            return
        if wait_unless_stopping(then):
            return  # the cluster is stopping: the step waits as recorded, the sweeper hands it out when due


def steps_resume_due(*, now=None) -> int:
    """The sweeper: hand every current step that is due (pending, back from a wait, or with a dead worker's
    expired lease) to a worker. Claims are exclusive, so a step handed out twice still runs once."""
    now = now or timezone.now()
    due = list(
        ProvisioningStep.objects.filter(run__state=RunState.RUNNING, position=F("run__current_position"))
        .filter(
            Q(state=StepState.PENDING)
            | Q(state=StepState.WAITING, retry_at__lte=now)
            | Q(state=StepState.RUNNING, lease_expires_at__lt=now)
        )
        .values_list("pk", flat=True)
    )
    for step_id in due:
        step_task(step_id)
    return len(due)


# --- Claim ------------------------------------------------------------------------------------------------


@transaction.atomic
def _claim(step_id: int, owner: uuid.UUID) -> tuple[ProvisioningStep, datetime] | None:
    """The step, now ours under a lease, and the deadline of this attempt; None when it is not ours to run."""
    step = (
        ProvisioningStep.objects.select_for_update(of=("self",))
        .select_related("run__request__requester", "run__allocation__node")  # what the attempt's context needs
        .filter(pk=step_id)
        .first()
    )
    now = timezone.now()
    if step is None or step.run.state != RunState.RUNNING or step.position != step.run.current_position:
        return None
    if _lease_expired(step, now):
        _append_log(step, f"attempt {step.attempts}: its worker stopped answering (lease expired)")
        if step.attempts >= step.max_attempts:
            _fail(
                step,
                StepError("worker_lost", "The worker running the last attempt stopped answering.", retryable=False),
            )
            return None
    elif not _claimable(step, now):
        return None
    definition = definition_of(step.run.pipeline, step.run.kind, step.position)
    step.claim(owner=owner, now=now)
    if definition.polls and step.deadline_at is None:
        step.deadline_at = now + timedelta(seconds=step.timeout_seconds)
    deadline = _attempt_deadline(step, definition.polls, now)
    step.lease_expires_at = _renewed_lease(deadline, now)
    step.save()
    return step, deadline


def _attempt_deadline(step: ProvisioningStep, polls: bool, now) -> datetime:
    """An attempt may run for the step's timeout; a polling step's attempts share the step's deadline (each check
    still gets one lease, so the one that finds the deadline passed can record the timeout)."""
    if polls:
        return max(step.deadline_at, now + timedelta(seconds=settings.PROVISIONING_LEASE_SECONDS))
    return now + timedelta(seconds=step.timeout_seconds)


def _renewed_lease(deadline: datetime, now) -> datetime:
    return min(now + timedelta(seconds=settings.PROVISIONING_LEASE_SECONDS), deadline)


def _lease_expired(step: ProvisioningStep, now) -> bool:
    return step.state == StepState.RUNNING and step.lease_expires_at < now


def _claimable(step: ProvisioningStep, now) -> bool:
    return step.state == StepState.PENDING or (step.state == StepState.WAITING and step.retry_at <= now)


# --- Heartbeat --------------------------------------------------------------------------------------------


class _Heartbeat:
    """Renews the step's lease every third of PROVISIONING_LEASE_SECONDS while the attempt runs, up to the attempt's
    deadline; stops at once when the attempt ends or the lease is no longer ours (another worker took over)."""

    def __init__(self, step_id: int, owner: uuid.UUID, deadline: datetime):
        self.step_id, self.owner, self.deadline = step_id, owner, deadline
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"lease-heartbeat-{step_id}", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stopped.set()
        self.thread.join()

    def _beat(self) -> None:
        try:
            while not self.stopped.wait(settings.PROVISIONING_LEASE_SECONDS / 3) and self._renew():
                pass
        finally:
            connections.close_all()  # this thread's own connection, if it opened one

    def _renew(self) -> bool:
        """Extend the lease; False once the attempt's deadline has passed or the lease is no longer ours."""
        now = timezone.now()
        if now >= self.deadline:
            return False
        try:
            ours = ProvisioningStep.objects.filter(pk=self.step_id, state=StepState.RUNNING, lease_owner=self.owner)
            return bool(ours.update(lease_expires_at=_renewed_lease(self.deadline, now)))
        except DatabaseError:  # a busy database: the lease still has two beats to go, try again on the next
            logger.warning("Could not renew the lease of provisioning step #%s", self.step_id, exc_info=True)
            return True


# --- Attempt ----------------------------------------------------------------------------------------------


def _attempt(step: ProvisioningStep) -> Done | Waiting | StepError:
    started = time.monotonic()
    context = None
    try:
        context = _context(step)
        output = definition_of(step.run.pipeline, step.run.kind, step.position).handler(context)
    except StepPending as pending:
        return _waiting(step, pending)
    except StepError as error:
        return error
    except Exception as error:  # a bug or an unexpected answer must fail the attempt, not kill the worker
        logger.exception("Provisioning step %s (#%s) raised", step.name, step.pk)
        return StepError("internal_error", f"Unexpected {type(error).__name__}: {error}")
    finally:
        if context is not None:
            context.close()
    output.setdefault("seconds", round(time.monotonic() - started, 3))
    return Done(output)


def _waiting(step: ProvisioningStep, pending: StepPending) -> Waiting | StepError:
    remaining = (step.deadline_at - timezone.now()).total_seconds() if step.deadline_at else pending.retry_after
    if remaining <= 0:
        return StepError(
            "step_timeout", f"Still not done after {step.timeout_seconds} s: {pending.message}", retryable=False
        )
    return Waiting(min(pending.retry_after, remaining), pending.message)


def _context(step: ProvisioningStep) -> StepContext:
    run = step.run
    if run.allocation.request_id == run.request_id:
        run.allocation.request = run.request  # the same row, already read by the claim (the expiry reads it)
    return StepContext(run=step.run, step=step, target=run_target(step.run, attempt=step.attempts))


# --- Record -----------------------------------------------------------------------------------------------


@transaction.atomic
def _record(step_id: int, owner: uuid.UUID, outcome: Done | Waiting | StepError) -> float | Following | None:
    """Store the attempt's outcome if the lease is still ours; returns how long to wait before the next attempt,
    or the run's next step once this one is done (None when the run is finished or the step no longer ours)."""
    # The run is locked too: a release cancelling it waits for this record, or this record sees it cancelled.
    following = ProvisioningStep.objects.filter(run=OuterRef("run"), position=OuterRef("position") + 1)
    step = (
        ProvisioningStep.objects.select_for_update(of=("self", "run"))
        .select_related("run")
        .annotate(following_id=Subquery(following.values("pk")[:1]))  # the run's next step, in the same read
        .get(pk=step_id)
    )
    if step.state != StepState.RUNNING or step.lease_owner != owner:
        return None  # our lease expired and another worker took the step over: its result counts, not ours
    if step.run.state != RunState.RUNNING:
        step.cancel()
        _append_log(step, f"attempt {step.attempts}: the run was {step.run.state}; result discarded")
        step.save()
        return None
    if isinstance(outcome, Done):
        return _succeed(step, outcome.output)
    if isinstance(outcome, Waiting):
        return _wait(step, outcome.seconds, Wait.EVENT, outcome.message)
    return _retry_or_fail(step, outcome)


def _succeed(step: ProvisioningStep, output: dict) -> Following | None:
    step.succeed(output=output)
    if output.get("mig_instances") and step.run.allocation_id:  # the host created GPU instances: record their ids
        mig_services.mig_instances_created(allocation_id=step.run.allocation_id, reported=output["mig_instances"])
    _append_log(step, f"attempt {step.attempts}: done in {output.get('seconds', 0)} s")
    step.save()
    run = step.run
    run.current_position = step.position + 1
    run.save(update_fields=["current_position"])
    following = step.following_id
    if following is None:
        services.run_succeeded(run, output)
        return None
    return Following(following, polls=definition_of(run.pipeline, run.kind, run.current_position).polls)


def _wait(step: ProvisioningStep, seconds: float, waiting_for: str, message: str) -> float:
    step.wait(until=timezone.now() + timedelta(seconds=seconds), waiting_for=waiting_for)
    if not step.log.endswith(f" {message}\n"):  # a poll repeats itself; log it once
        _append_log(step, message)
    step.save()
    return seconds


def _retry_or_fail(step: ProvisioningStep, error: StepError) -> float | None:
    step.error = _error_data(error)  # kept while the step waits for its next attempt
    if not error.retryable or step.attempts >= step.max_attempts:
        _fail(step, error)
        return None
    backoff = min(
        settings.PROVISIONING_BACKOFF_SECONDS * 2 ** (step.attempts - 1), settings.PROVISIONING_BACKOFF_MAX_SECONDS
    )
    message = (
        f"Step '{step.name}' failed (attempt {step.attempts} of {step.max_attempts}): {error.message} "
        f"Retrying in {backoff:g} s."
    )
    record_event(
        step.run.request,
        actor=None,
        code=EventCode.PROVISIONING_STEP_FAILED,
        message=message,
        data={"run": step.run_id, "step": step.name, "attempt": step.attempts, "code": error.code},
    )
    return _wait(step, backoff, Wait.RETRY, f"attempt {step.attempts}: {error.code}: {error.message}")


def _fail(step: ProvisioningStep, error: StepError) -> None:
    step.fail(error=_error_data(error))
    _append_log(step, f"attempt {step.attempts}: failed for good: {error.code}: {error.message}")
    step.save()
    services.run_failed(step.run, step, error)


def _error_data(error: StepError) -> dict:
    return {"code": error.code, "message": error.message, "details": error.details}


def _append_log(step: ProvisioningStep, line: str) -> None:
    step.log = (step.log + f"{timezone.now():%H:%M:%S} {line}\n")[-LOG_LIMIT:]
