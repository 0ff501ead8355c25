"""A queued request's expected start in words ("Expected to start in about 40 min (20-70 min)."), from the estimate
the scheduling cycle stored with its queue status (`ResourceRequest.queue_estimate`, written by scheduling's
forecast) or that the order preview worked out. Said relative to the moment it is read, so a stored estimate reads
right between cycles; the times themselves stay in the data."""

from datetime import datetime, timedelta

from django.utils import timezone

# Why there is no time, by the forecast's codes (scheduling.engine.forecast) and, for work that waits for something
# other than capacity, by its queue reason.
NO_TIME = {
    "running_without_end": "No expected start yet: work it waits for has no set end.",
    "beyond_forecast": "No expected start yet: it is further back in the queue than the forecast looks ahead.",
    "no_release_fits": "No expected start: none of the work running or queued ahead ends in a way that makes room.",
    "no_window_in_horizon": "No expected start: no node is free for its window before the reservation horizon ends.",
}
# A timed estimate whose start a window held ahead delays (scheduling.engine.forecast): its reason names the window.
HELD_WINDOW = frozenset({"reservation_ahead", "maintenance"})
NOT_TIMED = {
    "quota_exhausted": "No start time while it waits for its project's quota.",
    "no_matching_spec": "No start time: no node could ever hold it.",
    "backend_unavailable": "No start time while the backend it needs does not answer.",
    "insufficient_healthy_capacity": "No start time while too few healthy cards are in service for it.",
}


def expected_start(estimate, now: datetime | None = None) -> dict | None:
    """{earliest, likely, latest (ISO times or null), code, reason, message}; None when no estimate was made."""
    if not isinstance(estimate, dict) or not estimate:
        return None
    return {
        **{key: estimate.get(key) for key in ("earliest", "likely", "latest", "code", "reason")},
        "message": _message(estimate, now or timezone.now()),
    }


def _message(estimate: dict, now: datetime) -> str:
    if estimate.get("likely") is None:
        code, reason = estimate.get("code"), estimate.get("reason")
        if code == "not_timed":
            return NOT_TIMED.get(reason, f"No start time while it waits: {str(reason).replace('_', ' ')}.")
        return NO_TIME.get(code, "No expected start: unknown.")
    earliest, likely, latest = (datetime.fromisoformat(estimate[key]) - now for key in ("earliest", "likely", "latest"))
    if latest <= timedelta(minutes=1):
        return "Expected to start at the next scheduling cycle."
    said = f"Expected to start in about {_span(likely)}"
    if _span(earliest) != _span(latest):
        low, high, unit = _range(earliest, latest)
        said = f"{said} ({low}-{high} {unit})"
    held = estimate.get("reason") if estimate.get("code") in HELD_WINDOW else None
    return f"{said}: {held}." if held else f"{said}."


def _span(delta: timedelta) -> str:
    """A wait rounded as a person says it: minutes (to 5) under 90 min, hours under 2 days, then days."""
    minutes = max(1, round(delta.total_seconds() / 60))
    if minutes < 90:
        return f"{_rounded_minutes(minutes)} min"
    if minutes < 48 * 60:
        return f"{round(minutes / 60)} h"
    days = round(minutes / 1440)
    return f"{days} days"


def _rounded_minutes(minutes: int) -> int:
    return minutes if minutes < 10 else 5 * round(minutes / 5)


def _range(earliest: timedelta, latest: timedelta) -> tuple[int, int, str]:
    """Both ends in the unit of the later one ("20-70 min", "1-5 h")."""
    low, high = max(0, round(earliest.total_seconds() / 60)), max(1, round(latest.total_seconds() / 60))
    if high < 90:
        return _rounded_minutes(low), _rounded_minutes(high), "min"
    if high < 48 * 60:
        return round(low / 60), round(high / 60), "h"
    return round(low / 1440), round(high / 1440), "days"
