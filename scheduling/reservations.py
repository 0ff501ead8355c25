"""Advance reservations in the queue (the order side is requests/reservations.py, the capacity side
scheduling/reservation_windows.py): a queued reservation whose window has not begun waits, with a reason that says
when it starts, and the cycle starts it at its start and not before. Its expected start is its start."""

from datetime import datetime

from requests.models import ResourceRequest

RESERVATION_NOT_DUE = "reservation_not_due"  # the queue reason of a reservation before its window


def said(moment: datetime) -> str:
    return f"{moment:%a %d %b %H:%M} UTC"


def not_due(queue: list[ResourceRequest], now: datetime) -> dict[int, dict]:
    """The queued reservations whose window has not begun, each with its reason (code, message, numbers)."""
    return {
        request.pk: {
            "code": RESERVATION_NOT_DUE,
            "message": f"Reserved from {said(request.reserved_start)}; it starts then.",
            "numbers": {"start": request.reserved_start.isoformat(), "hours": request.duration_hours},
        }
        for request in queue
        if request.reserved_start is not None and request.reserved_start > now
    }


def not_due_estimates(reasons: dict[int, dict]) -> dict[int, dict]:
    """A reservation not begun is expected to start at its start, exactly."""
    return {
        pk: {"earliest": start, "likely": start, "latest": start, "code": None, "reason": None}
        for pk, reason in reasons.items()
        if reason["code"] == RESERVATION_NOT_DUE
        for start in [reason["numbers"]["start"]]
    }
