"""The idle decision, pure (no Django): given a policy's terms, what a request's signals last said, and where its
watch stands, what the sweep does now and why.

Idle since = the latest sign of use among the watched signals (a busy reading, an open session, a gateway call) or
the start of the work. Utilisation counts only with evidence: readings that stopped arriving say nothing, so the
work is not idle on that account (no reading, no evidence, no action) — except a serving endpoint, judged by its
gateway calls, whose readings count only where there are any. A warning or snooze belongs to one idle
episode: a sign of use after it clears it. The action runs only after a warning at least the lead before it, and
never on work that cannot be stopped (bare-metal leases are warned only).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

NOTHING, WARN, CLEAR, ACT = "nothing", "warn", "clear", "act"  # metering.choices.IdleStep's values

# Readings older than this say nothing about now (the collector and agents report every minute or so).
READINGS_FRESH_FOR = timedelta(minutes=15)


@dataclass(frozen=True)
class Terms:
    """An IdlePolicy's terms; utilization_below_pct None: utilisation is not watched."""

    utilization_below_pct: float | None
    watch_sessions: bool
    watch_gateway: bool
    idle: timedelta
    lead: timedelta
    # Without fresh readings work is not judged idle; an endpoint is judged by its calls, its readings count when
    # there are any.
    readings_required: bool = True


@dataclass(frozen=True)
class Activity:
    """What the platform last heard about one running request."""

    started_at: datetime
    last_reading_at: datetime | None = None
    last_busy_reading_at: datetime | None = None  # the last reading at or above the threshold
    last_utilization_pct: float | None = None  # the highest card's latest reading
    last_session_at: datetime | None = None
    last_call_at: datetime | None = None


@dataclass(frozen=True)
class Watch:
    """Where the request's watch stands (an IdleWatch row, or none yet)."""

    warned_at: datetime | None = None
    snoozed_at: datetime | None = None
    snoozed_until: datetime | None = None


@dataclass(frozen=True)
class Verdict:
    idle_since: datetime | None  # None: not idle (or no evidence)
    reasons: list[dict] = field(default_factory=list)  # {code, message, details} per watched signal

    def idle_for(self, now: datetime) -> timedelta:
        return now - self.idle_since if self.idle_since else timedelta(0)


@dataclass(frozen=True)
class Step:
    kind: str  # NOTHING, WARN, CLEAR or ACT
    verdict: Verdict
    acts_at: datetime | None = None  # for WARN: when the action is due


def duration_in_words(span: timedelta) -> str:
    """An hour and a half -> "1 h 30 min"; under a minute -> "0 min"."""
    hours, minutes = divmod(int(span.total_seconds() // 60), 60)
    return f"{hours} h {minutes} min" if hours and minutes else f"{hours} h" if hours else f"{minutes} min"


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def decide(terms: Terms, activity: Activity, now: datetime) -> Verdict:
    """Since when the request has been idle on every watched signal, with one reason per signal; or not idle."""
    marks, reasons = [activity.started_at], []
    fresh = activity.last_reading_at is not None and now - activity.last_reading_at <= READINGS_FRESH_FOR
    if terms.utilization_below_pct is not None and (fresh or terms.readings_required):
        if not fresh:
            return Verdict(
                None,
                [
                    {
                        "code": "no_readings",
                        "message": "No recent accelerator readings: not judged idle without evidence.",
                        "details": {"last_reading_at": _iso(activity.last_reading_at)},
                    }
                ],
            )
        marks.append(activity.last_busy_reading_at)
        reasons.append(
            {
                "code": "accelerators_idle",
                "message": f"Accelerator utilisation below {terms.utilization_below_pct:g}%.",
                "details": {
                    "threshold_pct": terms.utilization_below_pct,
                    "last_utilization_pct": activity.last_utilization_pct,
                    "last_busy_at": _iso(activity.last_busy_reading_at),
                    "last_reading_at": _iso(activity.last_reading_at),
                },
            }
        )
    if terms.watch_sessions:
        marks.append(activity.last_session_at)
        reasons.append(
            {
                "code": "no_sessions",
                "message": "No SSH or Jupyter session open.",
                "details": {"last_session_at": _iso(activity.last_session_at)},
            }
        )
    if terms.watch_gateway:
        marks.append(activity.last_call_at)
        reasons.append(
            {
                "code": "no_gateway_calls",
                "message": "No calls through the gateway.",
                "details": {"last_call_at": _iso(activity.last_call_at)},
            }
        )
    if not reasons:
        return Verdict(None, [{"code": "no_signals", "message": "The policy watches no signal.", "details": {}}])
    idle_since = max(mark for mark in marks if mark is not None)
    return Verdict(idle_since if idle_since < now else None, reasons)


def next_step(*, terms: Terms, activity: Activity, watch: Watch, now: datetime, stoppable: bool) -> Step:
    """What the sweep does now: warn (the action is due within the lead), act (due, and warned at least the lead
    before), clear (used again since the warning or snooze), or nothing."""
    verdict = decide(terms, activity, now)
    noticed = max((moment for moment in (watch.warned_at, watch.snoozed_at) if moment), default=None)
    if noticed and (verdict.idle_since is None or verdict.idle_since > noticed):
        return Step(CLEAR, verdict)
    if verdict.idle_since is None:
        return Step(NOTHING, verdict)
    due = verdict.idle_since + terms.idle
    if watch.snoozed_until and watch.snoozed_until > due:
        due = watch.snoozed_until
    if watch.warned_at is None:
        if now >= due - terms.lead:
            # Warned late (the sweep was down): the owner still gets the whole lead.
            return Step(WARN, verdict, acts_at=max(due, now + terms.lead) if stoppable else None)
        return Step(NOTHING, verdict)
    if stoppable and now >= due and now - watch.warned_at >= terms.lead:
        return Step(ACT, verdict)
    return Step(NOTHING, verdict)
