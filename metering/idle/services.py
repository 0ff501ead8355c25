"""Every idle write: the periodic sweep (warn, clear, act) and the owner's snooze. Each request is decided on its own
locked rows in its own transaction, so two workers never warn or act twice and a busy row is looked at next pass."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from config.errors import Conflict, DomainError, NotPermitted
from metering.choices import IdleAction
from metering.idle import decide
from metering.idle.selectors import Watched, watch_of, watched_requests
from metering.idle.signals import idle_scale_to_zero
from metering.models import IdlePolicy, IdleWatch
from requests.choices import EventCode, RequestState
from requests.models import ResourceRequest
from requests.services import can_release, record_event, request_release
from tenancy.models import User

MAX_REASON_LENGTH = 300
# What each action is called in the warning ("… at 16:30 UTC") and on the timeline once done.
_ACTS = {IdleAction.RELEASE: "Stops", IdleAction.SCALE_TO_ZERO: "Scales to zero replicas (woken by its next call)"}
_DONE = {
    IdleAction.RELEASE: "Stopped and released",
    IdleAction.SCALE_TO_ZERO: "Scaled to zero replicas (its route, keys and record stay; its next call wakes it)",
}


@dataclass
class SweepReport:
    warned: list[int] = field(default_factory=list)
    cleared: list[int] = field(default_factory=list)
    acted: list[int] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)  # locked by another transaction: next pass

    def as_dict(self) -> dict:
        return {"warned": self.warned, "cleared": self.cleared, "acted": self.acted, "busy": self.busy}


def idle_sweep(*, now: datetime | None = None) -> SweepReport:
    """Decide every running request under an idle policy (read in one query); write only for those whose step is
    not `nothing`."""
    now = now or timezone.now()
    report = SweepReport()
    for watched in watched_requests():
        step = decide.next_step(
            terms=watched.terms,
            activity=watched.activity,
            watch=watch_of(watched.watch),
            now=now,
            stoppable=watched.stoppable,
        )
        if step.kind != decide.NOTHING:
            _apply(watched, step, now, report)
    return report


def _locked_watch(watched: Watched) -> IdleWatch | None:
    """The request (still active) and its watch, locked; None when another transaction holds the request."""
    request = (
        ResourceRequest.objects.select_for_update(skip_locked=True)
        .filter(pk=watched.request.pk, state=RequestState.ACTIVE)
        .first()
    )
    if request is None:
        return None
    watch, _ = IdleWatch.objects.select_for_update().get_or_create(request=request)
    watch.request = request
    return watch


def _apply(watched: Watched, step: decide.Step, now: datetime, report: SweepReport) -> None:
    with transaction.atomic():
        watch = _locked_watch(watched)
        if watch is None:
            report.busy.append(watched.request.pk)
            return
        # Decided again on the locked row: a snooze or another worker's warning since the batch read wins.
        step = decide.next_step(
            terms=watched.terms, activity=watched.activity, watch=watch_of(watch), now=now, stoppable=watched.stoppable
        )
        if step.kind == decide.WARN:
            _warn(watch, step, watched, now)
            report.warned.append(watch.request_id)
        elif step.kind == decide.CLEAR:
            _clear(watch, step, watched, now)
            report.cleared.append(watch.request_id)
        elif step.kind == decide.ACT:
            _act(watch, step, watched, now)
            report.acted.append(watch.request_id)


def _reasons_in_words(verdict: decide.Verdict) -> str:
    return " ".join(reason["message"] for reason in verdict.reasons)


def _warn(watch: IdleWatch, step: decide.Step, watched: Watched, now: datetime) -> None:
    idle_for = decide.duration_in_words(step.verdict.idle_for(now))
    if step.acts_at is None:
        then = "Bare-metal leases are not stopped for being idle: release it if you are done."
    else:
        then = (
            f"{_ACTS[watched.policy.action]} at {step.acts_at:%Y-%m-%d %H:%M} UTC unless it is used again or you "
            f"snooze it ({max(0, watched.policy.max_snoozes - watch.snoozes)} snooze(s) left)."
        )
    watch.idle_since, watch.warned_at, watch.acts_at = step.verdict.idle_since, now, step.acts_at
    watch.reasons = step.verdict.reasons
    watch.save()
    record_event(
        request=watch.request,
        actor=None,
        code=EventCode.IDLE_WARNING,
        message=f"Idle for {idle_for}: {_reasons_in_words(step.verdict)} {then}",
        data={
            "idle_since": step.verdict.idle_since.isoformat(),
            "acts_at": step.acts_at.isoformat() if step.acts_at else None,
            "reasons": step.verdict.reasons,
        },
    )


def _end_episode(watch: IdleWatch, watched: Watched, until: datetime) -> float:
    """Add the episode's idle card-seconds (from its start to `until`) and forget the warning and snooze."""
    seconds = max(0.0, (until - watch.idle_since).total_seconds()) * watched.cards if watch.idle_since else 0.0
    watch.idle_card_seconds += seconds
    watch.idle_since = watch.warned_at = watch.acts_at = watch.snoozed_at = watch.snoozed_until = None
    return seconds


def _clear(watch: IdleWatch, step: decide.Step, watched: Watched, now: datetime) -> None:
    used_again = step.verdict.idle_since or now
    _end_episode(watch, watched, min(used_again, now))
    watch.reasons = step.verdict.reasons
    watch.save()
    record_event(
        request=watch.request,
        actor=None,
        code=EventCode.IDLE_CLEARED,
        message="Used again: the idle warning is cleared, nothing will be stopped.",
        data={"reasons": step.verdict.reasons},
    )


def _act(watch: IdleWatch, step: decide.Step, watched: Watched, now: datetime) -> None:
    idle_for = decide.duration_in_words(step.verdict.idle_for(now))
    warned_at = watch.warned_at
    _end_episode(watch, watched, now)
    watch.reasons = step.verdict.reasons
    watch.save()
    action = watched.policy.action
    record_event(
        request=watch.request,
        actor=None,
        code=EventCode.IDLE_STOPPED,
        message=f"{_DONE[action]}: idle for {idle_for} ({_reasons_in_words(step.verdict)}), warned at "
        f"{warned_at:%Y-%m-%d %H:%M} UTC.",
        data={
            "action": action,
            "idle_since": step.verdict.idle_since.isoformat(),
            "warned_at": warned_at.isoformat(),
            "reasons": step.verdict.reasons,
        },
    )
    reason = f"idle for {idle_for} after a warning"
    if action == IdleAction.SCALE_TO_ZERO:
        request_id = watch.request_id
        transaction.on_commit(
            lambda: idle_scale_to_zero.send(sender=IdleWatch, request_id=request_id, reason=f"scaled to zero: {reason}")
        )
    else:
        request_release(request=watch.request, actor=None, reason=reason)


@transaction.atomic
def idle_snooze(*, request: ResourceRequest, actor: User, reason: str, now: datetime | None = None) -> IdleWatch:
    """Postpone a warned request's stop by the policy's snooze time, with a reason, on its timeline. Whoever may
    release the request may snooze it, as often as the policy allows."""
    now = now or timezone.now()
    reason = (reason or "").strip()
    if not can_release(actor, request):
        raise NotPermitted(
            "Only the requester, the project lead or an operator can snooze this request's idle stop.",
            code="permission_denied",
        )
    if not reason:
        raise DomainError("Say why the work should keep running.", code="reason_required", details={"field": "reason"})
    if len(reason) > MAX_REASON_LENGTH:
        raise DomainError(
            f"Keep the reason within {MAX_REASON_LENGTH} characters.",
            code="reason_too_long",
            details={"field": "reason", "max_length": MAX_REASON_LENGTH},
        )
    watch = IdleWatch.objects.select_for_update().filter(request=request).first()
    policy = IdlePolicy.objects.filter(service_id=request.service_id, active=True).first()
    if watch is None or watch.acts_at is None or watch.warned_at is None or policy is None:
        raise Conflict("Nothing to snooze: this request is not due to be stopped for being idle.", code="not_warned")
    if watch.snoozes >= policy.max_snoozes:
        raise Conflict(
            f"All {policy.max_snoozes} snoozes are used; use the work or release it.",
            code="snoozes_exhausted",
            details={"max_snoozes": policy.max_snoozes, "snoozes": watch.snoozes},
        )
    until = max(watch.acts_at, now) + timedelta(minutes=policy.snooze_minutes)
    watch.snoozes += 1
    watch.snoozed_at, watch.snoozed_until = now, until
    watch.warned_at, watch.acts_at = None, until
    watch.save()
    record_event(
        request=request,
        actor=actor,
        code=EventCode.IDLE_SNOOZED,
        message=f"Idle stop snoozed by {actor.display_name} until {until:%Y-%m-%d %H:%M} UTC "
        f"({watch.snoozes} of {policy.max_snoozes}): {reason}",
        data={"reason": reason, "snoozed_until": until.isoformat(), "snoozes": watch.snoozes},
    )
    return watch
