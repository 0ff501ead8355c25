"""Executing steps, crash-safe, in batches.

A worker claims the runs' current steps under a short lease (row locks, attempts counted), runs the handlers outside
any transaction while a heartbeat renews the leases, and records each outcome only if its lease is still its own.
A worker that dies mid-step stops renewing, so its leases expire within PROVISIONING_LEASE_SECONDS; the minute
sweeper (or the next event) hands the steps to another worker, which runs them again (handlers are idempotent). The
heartbeat renews no further than each attempt's timeout, so a hung attempt is taken over the same way. Completed
steps are never run again: a run's current position only moves forward.

One task carries the current steps of a batch of runs (about PROVISIONING_START_BATCH of them): they are claimed in one
transaction, steps at the same place of the same pipeline are attempted together (a handler with a batch form asks
its backend once for all of them: one Slurm job list for ten submissions) and the outcomes are recorded in one
transaction, each of which writes the batch's steps in one statement; the runs the record finishes activate their
requests together. What a batch costs in the database and the broker is then shared by its runs instead of paid per
step.
"""

import logging
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Case, F, OuterRef, Q, QuerySet, Subquery, When
from django.utils import timezone

from config.sql import update_from_values
from config.workers import stopping, wait_unless_stopping
from provisioning import outages, services
from provisioning.choices import RunState, StepState, Wait
from provisioning.drivers.base import BackendUnavailable, PlacementLost, StepError, StepPending, outcome_of
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.pipelines import StepDefinition, definition_of
from provisioning.step_tasks import step_task
from provisioning.steps import StepContext, StepOutputs
from provisioning.targets import runs_targets
from requests.choices import EventCode
from requests.services import record_event
from scheduling.mig import services as mig_services

logger = logging.getLogger(__name__)

LOG_LIMIT = 4000
# What a claim writes (the claim transition, the lease, a polling step's deadline, a takeover's log line): the
# step's output and error stay as they are, unwritten.
CLAIMED_FIELDS = [
    "state",
    "attempts",
    "lease_owner",
    "lease_expires_at",
    "waiting_for",
    "retry_at",
    "started_at",
    "deadline_at",
    "log",
]
# What the end of an attempt writes (succeeded, waiting, failed or cancelled, with its log line).
ENDED_FIELDS = [
    "state",
    "lease_owner",
    "lease_expires_at",
    "waiting_for",
    "retry_at",
    "deadline_at",
    "outage_since",
    "finished_at",
    "output",
    "error",
    "log",
]


@dataclass
class Done:
    output: dict


@dataclass
class Waiting:
    seconds: float
    message: str


Outcome = Done | Waiting | StepError | PlacementLost


@dataclass
class Following:
    """The run's next step, pending once the step before it was recorded."""

    step_id: int
    computed: bool = False  # it calls nothing (pipelines.StepDefinition.computed): done in the same record


@dataclass
class Finished:
    """The run's last step is done: the record's transaction finishes the run (and its batch's other finished runs
    with it)."""

    run: ProvisioningRun
    last_output: dict


@dataclass
class OutageWait:
    """The step waits for a node's own service to answer again, and this worker asks it again while the outage is
    young and its chain lasts (a blip costs seconds); otherwise the sweeper does, or the backend's return
    (outages.py)."""

    seconds: float


@dataclass
class Claimed:
    step: ProvisioningStep
    deadline: datetime  # when this attempt must be over


def steps_execute(*, step_ids: list[int]) -> None:
    """The task body: attempt the steps until each is finished, or waits longer than a worker should sleep, or
    belongs to another worker, or the worker is stopping. A finished step's successor is attempted next by the same
    worker while the chain's budget lasts: a request goes through its pipeline at once instead of queueing behind
    every other request's current step, and the broker carries one task per batch of runs instead of one per step.
    A polling successor (the readiness watch right after the submissions) stays here too: whichever worker took it
    from the broker would be held watching just as long, and the trip there and back would come on top of the wait
    (while this worker watches, the others submit: the backend takes one submission at a time anyway)."""
    chain_ends = time.monotonic() + settings.PROVISIONING_CHAIN_SECONDS
    due = dict.fromkeys(step_ids, time.monotonic())  # step id -> when this worker attempts it next
    while due:
        now = time.monotonic()
        ready = [step_id for step_id, at in due.items() if at <= now]
        if not ready:
            if wait_unless_stopping(min(due.values()) - now):
                return  # the cluster is stopping: the steps wait as recorded, the sweeper hands them out when due
            continue
        for step_id in ready:
            del due[step_id]
        to_broker = []
        for step_id, then in _execute_once(ready).items():
            if isinstance(then, Following):
                if stopping() or time.monotonic() >= chain_ends:
                    to_broker.append(then.step_id)  # the rest of the run goes back to the broker
                else:
                    due[then.step_id] = time.monotonic()
            elif isinstance(then, OutageWait):
                if time.monotonic() + then.seconds < chain_ends and not stopping():
                    due[step_id] = time.monotonic() + then.seconds
            elif then is not None and then <= settings.PROVISIONING_INLINE_WAIT_SECONDS and not stopping():
                due[step_id] = time.monotonic() + then
        if to_broker:
            step_task(step_ids=to_broker)


def _execute_once(step_ids: list[int]) -> dict[int, float | OutageWait | Following | None]:
    """One attempt of each step that is ours to run; what to do next with each, by step id."""
    owner = uuid.uuid4()
    claimed = _claim(step_ids, owner)
    if not claimed:
        return {}
    with _Heartbeat(claimed, owner):
        outcomes = _attempt(claimed)
    return _record(owner, outcomes)


def steps_resume_due(*, now=None) -> int:
    """The sweeper: hand every current step that is due (pending, back from a wait, or with a dead worker's
    expired lease) to a worker, in batches. Claims are exclusive, so a step handed out twice still runs once."""
    now = now or timezone.now()
    due = list(
        ProvisioningStep.objects.filter(run__state=RunState.RUNNING, position=F("run__current_position"))
        .filter(
            Q(state=StepState.PENDING)
            | Q(state=StepState.WAITING, retry_at__lte=now)
            | Q(state=StepState.RUNNING, lease_expires_at__lt=now)
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    size = max(1, settings.PROVISIONING_START_BATCH)
    for first in range(0, len(due), size):
        step_task(step_ids=due[first : first + size])
    return len(due)


# --- Claim ------------------------------------------------------------------------------------------------


@transaction.atomic
def _claim(step_ids: list[int], owner: uuid.UUID) -> list[Claimed]:
    """The steps now ours under a lease, with the deadline of each attempt; those not ours to run are left out.
    Rows are locked in primary-key order, so two workers claiming overlapping batches cannot deadlock. A claimed step
    that calls nothing on its run (Slurm's image step: nothing to pull) is done and recorded in this transaction, and
    its run's next step is claimed in its place: a claim and a record saved per batch, on the way to the backend."""
    claimed = _claim_locked(_locked_for_attempts(step_ids), owner)
    _write([item.step for item in claimed], CLAIMED_FIELDS)
    computed = [item for item in claimed if _computed(item.step)]
    if not computed:
        return claimed
    recorded = _record(owner, _attempt(computed))
    following = [then.step_id for then in recorded.values() if isinstance(then, Following)]
    return [item for item in claimed if item not in computed] + (_claim(following, owner) if following else [])


def _computed(step: ProvisioningStep) -> bool:
    return definition_of(step.run.pipeline, step.run.kind, step.position).computed_for(step.run)


def _locked_for_attempts(step_ids) -> QuerySet:
    return (
        ProvisioningStep.objects.select_for_update(of=("self",))
        .select_related("run__request__requester", "run__allocation__node")  # what the attempts' contexts need
        .filter(pk__in=step_ids)
        .order_by("pk")
    )


def _claim_locked(steps: QuerySet, owner: uuid.UUID) -> list[Claimed]:
    now = timezone.now()
    return [claimed for step in steps if (claimed := _claim_one(step, owner, now)) is not None]


def _following_id() -> Subquery:
    """The run's next step's id, read with the step."""
    following = ProvisioningStep.objects.filter(run=OuterRef("run"), position=OuterRef("position") + 1)
    return Subquery(following.values("pk")[:1])


def _claim_one(step: ProvisioningStep, owner: uuid.UUID, now) -> Claimed | None:
    if step.run.state != RunState.RUNNING or step.position != step.run.current_position:
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
    return Claimed(step, deadline)


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
    """Renews the batch's leases every third of PROVISIONING_LEASE_SECONDS while the attempts run, each up to its
    attempt's deadline, in one statement; stops at once when the attempts end, and renews no lease that is no longer
    ours (another worker took the step over)."""

    def __init__(self, claimed: list[Claimed], owner: uuid.UUID):
        self.deadlines = {item.step.pk: item.deadline for item in claimed}
        self.owner = owner
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"lease-heartbeat-{min(self.deadlines)}", daemon=True)

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
        """Extend the leases of the attempts still within their deadlines; False once none is left to renew."""
        now = timezone.now()
        live = {step_id: deadline for step_id, deadline in self.deadlines.items() if now < deadline}
        if not live:
            return False
        try:
            ProvisioningStep.objects.filter(pk__in=live, state=StepState.RUNNING, lease_owner=self.owner).update(
                lease_expires_at=Case(
                    *(When(pk=step_id, then=_renewed_lease(deadline, now)) for step_id, deadline in live.items())
                )
            )
        except DatabaseError:  # a busy database: the leases still have two beats to go, try again on the next
            logger.warning("Could not renew the leases of provisioning steps %s", sorted(live), exc_info=True)
        return True


# --- Attempt ----------------------------------------------------------------------------------------------


def _attempt(claimed: list[Claimed]) -> dict[int, Outcome]:
    """Each claimed step's outcome, by step id. The steps at one place of one pipeline on one backend go to their
    handler's batch form together, when it has one."""
    try:
        contexts = _contexts([item.step for item in claimed])
    except Exception as error:  # a bug reading what the steps act on fails these attempts, not the worker
        logger.exception("Reading the targets of provisioning steps %s raised", [item.step.pk for item in claimed])
        return {item.step.pk: _outcome(item.step, error, 0.0) for item in claimed}
    groups = defaultdict(list)
    for context in contexts:
        run = context.run
        groups[(run.pipeline, run.kind, context.step.position, context.target.backend)].append(context)
    outcomes = {}
    for (pipeline, kind, position, _backend), group in groups.items():
        outcomes.update(_attempt_group(definition_of(pipeline, kind, position), group))
    return outcomes


def _attempt_group(definition: StepDefinition, contexts: list[StepContext]) -> dict[int, Outcome]:
    started = time.monotonic()
    try:
        if definition.batch_handler is not None:
            results = definition.batch_handler(contexts)
        else:
            results = [outcome_of(definition.handler, context) for context in contexts]
    except Exception as error:  # a bug in a batch form fails these attempts, not the worker
        logger.exception("Provisioning step %s raised for a batch of %s", definition.name, len(contexts))
        results = [error] * len(contexts)
    finally:
        for context in contexts:
            context.close()
    seconds = round((time.monotonic() - started) / len(contexts), 3)  # the batch's time, shared out among its runs
    return {
        context.step.pk: _outcome(context.step, result, seconds)
        for context, result in zip(contexts, results, strict=True)
    }


def _outcome(step: ProvisioningStep, result: dict | Exception, seconds: float) -> Outcome:
    if isinstance(result, StepPending):
        return _waiting(step, result)
    if isinstance(result, StepError | PlacementLost):
        return result
    if isinstance(result, Exception):  # a bug or an unexpected answer must fail the attempt, not kill the worker
        logger.error("Provisioning step %s (#%s) raised", step.name, step.pk, exc_info=result)
        return StepError("internal_error", f"Unexpected {type(result).__name__}: {result}")
    result.setdefault("seconds", seconds)
    return Done(result)


def _waiting(step: ProvisioningStep, pending: StepPending) -> Waiting | StepError:
    """The step polls again, or has polled past its deadline. An outage it waited out just now does not count: its
    record moves the deadline by as long (outages.outage_over), so it is not spent here either."""
    now = timezone.now()
    waited_out = now - step.outage_since if step.outage_since else timedelta(0)
    remaining = (step.deadline_at + waited_out - now).total_seconds() if step.deadline_at else pending.retry_after
    if remaining <= 0:
        return StepError(
            "step_timeout", f"Still not done after {step.timeout_seconds} s: {pending.message}", retryable=False
        )
    return Waiting(min(pending.retry_after, remaining), pending.message)


def _contexts(steps: list[ProvisioningStep]) -> list[StepContext]:
    runs = [step.run for step in steps]
    for run in runs:
        if run.allocation.request_id == run.request_id:
            run.allocation.request = run.request  # the same row, already read by the claim (the expiry reads it)
    targets = runs_targets([(step.run, step.attempts) for step in steps])
    outputs = StepOutputs([run.pk for run in runs])
    return [
        StepContext(run=step.run, step=step, target=target, batch_outputs=outputs)
        for step, target in zip(steps, targets, strict=True)
    ]


# --- Record -----------------------------------------------------------------------------------------------


@transaction.atomic
def _record(owner: uuid.UUID, outcomes: dict[int, Outcome]) -> dict[int, float | OutageWait | Following | None]:
    """Store each attempt's outcome whose lease is still ours; for each step, how long to wait before its next
    attempt, or the run's next step once this one is done (None when the run is finished or the step is no longer
    ours)."""
    # The runs are locked too: a release cancelling one waits for this record, or this record sees it cancelled.
    steps = (
        ProvisioningStep.objects.select_for_update(of=("self", "run"))
        .select_related("run")
        .annotate(following_id=_following_id())  # the run's next step, in the same read
        .filter(pk__in=outcomes)
        .order_by("pk")
    )
    # Not ours when our lease expired and another worker took the step over: its result counts, not ours.
    ours = [step for step in steps if step.state == StepState.RUNNING and step.lease_owner == owner]
    unavailable = [outcome for outcome in outcomes.values() if isinstance(outcome, BackendUnavailable)]
    answered = _outages_over(ours, outcomes)
    recorded = {step.pk: _record_one(step, outcomes[step.pk]) for step in ours}
    outages.backends_seen(unavailable=unavailable, answered=answered)
    _write([step for step in ours if step.state != StepState.FAILED], ENDED_FIELDS)  # a failure wrote its own
    _advance([step for step in ours if isinstance(recorded[step.pk], Following | Finished)])
    recorded |= _computed_successors(owner, recorded)
    finished = [(then.run, then.last_output) for then in recorded.values() if isinstance(then, Finished)]
    if finished:
        services.runs_succeeded(finished=finished)
    return {step.pk: None if isinstance(then := recorded.get(step.pk), Finished) else then for step in steps}


def _computed_successors(owner: uuid.UUID, recorded: dict) -> dict[int, Following | Finished | None]:
    """The successors that call nothing (publishing access from what the steps before recorded) claimed, done and
    recorded in the transaction that recorded their predecessors: a claim's and a record's transactions saved per
    batch on the way to active. By predecessor: what the successor's record leaves to do; None when it waits or
    failed (the sweeper hands a waiting one out when it is due, as any other)."""
    successor_of = {
        step_id: then.step_id for step_id, then in recorded.items() if isinstance(then, Following) and then.computed
    }
    if not successor_of:
        return {}
    # Read with their own successors: a computed step's record needs them, as a record always does.
    successors = _locked_for_attempts(successor_of.values()).annotate(following_id=_following_id())
    claimed = _claim_locked(successors, owner)
    outcomes = _attempt(claimed)
    done = {item.step.pk: _record_one(item.step, outcomes[item.step.pk]) for item in claimed}
    steps = [item.step for item in claimed]
    _write([step for step in steps if step.state != StepState.FAILED], sorted({*CLAIMED_FIELDS, *ENDED_FIELDS}))
    _advance([step for step in steps if isinstance(done[step.pk], Following | Finished)])
    return {
        step_id: then if isinstance(then := done.get(successor_id), Following | Finished) else None
        for step_id, successor_id in successor_of.items()
        if successor_id in done
    }


def _outages_over(steps: list[ProvisioningStep], outcomes: dict[int, Outcome]) -> set[str]:
    """The steps that waited out an outage and got an answer this time end their wait (outages.outage_over); the
    whole backends that answered."""
    now, answered = timezone.now(), set()
    for step in steps:
        if step.outage_since is None or step.run.state != RunState.RUNNING:
            continue
        if not isinstance(outcomes[step.pk], BackendUnavailable):
            backend = outages.outage_over(step, now)
            if backend is not None:
                answered.add(backend)
    return answered


def _write(steps: list[ProvisioningStep], fields: list[str]) -> None:
    """The steps' `fields` as their transitions left them, in one UPDATE for the batch instead of a save each. The
    claim and the record hold the steps' row locks and have seen each one's state, so a save's guard on the state
    it was read in (ConcurrentTransitionMixin) has nothing to add."""
    columns = [ProvisioningStep._meta.get_field(name) for name in fields]
    update_from_values(
        table=ProvisioningStep._meta.db_table,
        columns=[("id", "bigint"), *((column.column, column.db_type(connection)) for column in columns)],
        rows=[
            (step.pk, *(column.get_db_prep_save(getattr(step, column.attname), connection) for column in columns))
            for step in steps
        ],
        set_sql=", ".join(f"{column.column} = v.{column.column}" for column in columns),
    )


def _advance(succeeded: list[ProvisioningStep]) -> None:
    """Each run past the step that succeeded: one UPDATE for the runs at the same place (a batch's usually are).
    The record holds the runs' locks and has seen them running."""
    by_position = defaultdict(list)
    for step in succeeded:
        by_position[step.position + 1].append(step.run_id)
    for position, run_ids in by_position.items():
        ProvisioningRun.objects.filter(pk__in=run_ids).update(current_position=position)


def _record_one(step: ProvisioningStep, outcome: Outcome) -> float | OutageWait | Following | Finished | None:
    """The outcome on the step (`_record` writes it); None when the run is over or the step failed for good."""
    if step.run.state != RunState.RUNNING:
        step.cancel()
        _append_log(step, f"attempt {step.attempts}: the run was {step.run.state}; result discarded")
        return None
    if isinstance(outcome, Done):
        return _succeed(step, outcome.output)
    if isinstance(outcome, Waiting):
        return _wait(step, outcome.seconds, Wait.EVENT, outcome.message)
    if isinstance(outcome, PlacementLost):
        return _place_again(step, outcome)
    return _retry_or_fail(step, outcome)


def _succeed(step: ProvisioningStep, output: dict) -> Following | Finished:
    """The step done; the run moves past it (`_advance`, for the whole record)."""
    step.succeed(output=output)
    if output.get("mig_instances") and step.run.allocation_id:  # the host created GPU instances: record their ids
        mig_services.mig_instances_created(allocation_id=step.run.allocation_id, reported=output["mig_instances"])
    _append_log(step, f"attempt {step.attempts}: done in {output.get('seconds', 0)} s")
    run = step.run
    run.current_position = step.position + 1
    if step.following_id is None:
        return Finished(run, output)
    return Following(
        step.following_id, computed=definition_of(run.pipeline, run.kind, run.current_position).computed_for(run)
    )


def _wait(step: ProvisioningStep, seconds: float, waiting_for: str, message: str) -> float:
    step.wait(until=timezone.now() + timedelta(seconds=seconds), waiting_for=waiting_for)
    if not step.log.endswith(f" {message}\n"):  # a poll repeats itself; log it once
        _append_log(step, message)
    return seconds


def _place_again(step: ProvisioningStep, lost: PlacementLost) -> None:
    """The backend will not start the work on this node: the run stops here and the request is placed again."""
    step.cancel()
    _append_log(step, f"attempt {step.attempts}: {lost.reason['message']} The request is placed again.")
    services.run_placement_lost(run=step.run, step=step, reason=lost.reason)


def _retry_or_fail(step: ProvisioningStep, error: StepError) -> float | OutageWait | None:
    step.error = _error_data(error)  # kept while the step waits for its next attempt
    if isinstance(error, BackendUnavailable):
        return _wait_out_outage(step, error)
    if not error.retryable or step.attempts >= step.max_attempts:
        _fail(step, error)
        return None
    backoff = min(
        settings.PROVISIONING_BACKOFF_SECONDS * 2 ** (step.attempts - 1), settings.PROVISIONING_BACKOFF_MAX_SECONDS
    )
    label = definition_of(step.run.pipeline, step.run.kind, step.position).label
    message = (
        f"“{label}” failed (attempt {step.attempts} of {step.max_attempts}): {error.message} Retrying in {backoff:g} s."
    )
    record_event(
        request=step.run.request,
        actor=None,
        code=EventCode.PROVISIONING_STEP_FAILED,
        message=message,
        data={"run": step.run_id, "step": step.name, "attempt": step.attempts, "code": error.code},
    )
    return _wait(step, backoff, Wait.RETRY, f"attempt {step.attempts}: {error.code}: {error.message}")


def _wait_out_outage(step: ProvisioningStep, error: BackendUnavailable) -> OutageWait | None:
    """The backend did not answer: wait for it (outages.py), noted once per outage; a provisioning step fails when
    the outage outlasts its budget."""
    now = timezone.now()
    began = step.outage_since is None
    step.outage_since = step.outage_since or now
    if outages.budget_spent(step, now):
        _fail(step, outages.budget_error(step, error))
        return None
    if began:
        outages.note_outage(step, error)
    seconds = outages.retry_delay(step, now)
    step.wait(until=now + timedelta(seconds=seconds), waiting_for=Wait.OUTAGE)
    _append_log(step, f"attempt {step.attempts}: waiting for {error.waiting_for}: {error.code}: {error.message}")
    return OutageWait(seconds) if outages.asked_again_inline(step, error, seconds, now) else None


def _fail(step: ProvisioningStep, error: StepError) -> None:
    step.fail(error=_error_data(error))
    _append_log(step, f"attempt {step.attempts}: failed for good: {error.code}: {error.message}")
    step.save(update_fields=ENDED_FIELDS)
    services.run_failed(run=step.run, step=step, error=error)


def _error_data(error: StepError) -> dict:
    return {"code": error.code, "message": error.message, "details": error.details}


def _append_log(step: ProvisioningStep, line: str) -> None:
    step.log = (step.log + f"{timezone.now():%H:%M:%S} {line}\n")[-LOG_LIMIT:]
