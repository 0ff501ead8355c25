"""Advance reservations: an order for a future window (a start and its duration) instead of "as soon as it can run".

Admission judges a window where it falls, not now:
- the window starts in the future and ends within the horizon operators set (RESERVATION_HORIZON_DAYS); its length
  is the order's duration, bounded by the spec's limits like any order's;
- the concurrent dimensions (cards, memory, cores, tasks) count what the project (and its capped tenant) will hold
  during the window: the other reservations overlapping it and the work running now that is expected to still run at
  its start (its approved end is later; scheduling answers through the HELD_ENDS hook);
- monthly card-hours count in the month the window starts: this month's usage for a window starting this month, the
  reservations starting in that month for a later one (a window's card-hours all count in the month it starts);
- capacity: the window must fit the inventory with running work ending at its approved end and the other held
  reservations in place (scheduling's EARLIEST_WINDOW hook), else it is refused with the earliest window that fits.

Until its start a reservation counts in no "now" usage (requests.quota leaves it out of the concurrent sums and out of
the months before its own), so it never blocks work that ends before it.
"""

from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from catalog.choices import ServiceKind
from config.errors import Conflict, DomainError
from requests import hooks
from requests.choices import COMMITTED_STATES, RUNNING_STATES, RequestState
from requests.models import ResourceRequest
from requests.quota import ZERO, DimensionImpact, QuotaScope, month_start, next_month_start
from tenancy.choices import QuotaDimension
from tenancy.models import Project

D = QuotaDimension
# The dimensions a window holds for its whole length (monthly card-hours are judged per month).
CONCURRENT = (D.GPUS, D.ACCELERATOR_MEMORY_GB, D.CPU_CORES, D.MEMORY_GB, D.CONCURRENT_TASKS)
# Work that holds devices now and may still hold them at a window's start.
HOLDING_STATES = frozenset({*RUNNING_STATES, RequestState.RELEASING})


class ReservationInvalid(DomainError):
    status_code = 422
    code = "invalid_reservation"


class WindowTaken(Conflict):
    """The capacity of the window is taken; its details name the earliest window that fits."""

    code = "reservation_window_taken"


@dataclass(frozen=True)
class Window:
    start: datetime
    hours: int

    @property
    def end(self) -> datetime:
        return self.start + timedelta(hours=self.hours)

    def overlaps(self, start: datetime, end: datetime) -> bool:
        return start < self.end and end > self.start

    def as_data(self) -> dict:
        return {"start": self.start.isoformat(), "end": self.end.isoformat(), "hours": self.hours}


def horizon_end(now: datetime) -> datetime:
    return now + timedelta(days=settings.RESERVATION_HORIZON_DAYS)


def validate_window(*, service_kind: str, window: Window, now: datetime) -> None:
    """Refuse a window that is not a compute order's, has begun, or ends beyond the horizon."""
    if service_kind != ServiceKind.COMPUTE:
        raise ReservationInvalid(
            "Only compute orders can reserve a future window.", code="reservation_not_offered", details={}
        )
    if window.start <= now:
        raise ReservationInvalid(
            "A reservation must start in the future.",
            code="reservation_start_past",
            details={"field": "start_at", "start": window.start.isoformat(), "now": now.isoformat()},
        )
    latest = horizon_end(now)
    if window.end > latest:
        raise ReservationInvalid(
            f"A reservation must end within {settings.RESERVATION_HORIZON_DAYS} days (by {latest:%a %d %b %H:%M} "
            f"UTC); this one ends {window.end:%a %d %b %H:%M} UTC.",
            code="reservation_beyond_horizon",
            details={
                "field": "start_at",
                "horizon_days": settings.RESERVATION_HORIZON_DAYS,
                "latest_end": latest.isoformat(),
                "end": window.end.isoformat(),
            },
        )


def window_impacts(
    *, project: Project, scopes: list[QuotaScope], window: Window, demand, exclude: int = 0
) -> list[DimensionImpact]:
    """The window's impact on each of the project's scopes (quota_scopes): concurrent dimensions as held during the
    window, monthly card-hours in the month it starts. `exclude`: a stored request's own id (an approver sees it
    once, as `requested`)."""
    return [
        impact
        for scope in scopes
        for impact in _in_window(scope, _scope_projects(project, scope), window, exclude).impacts(demand)
    ]


def _in_window(scope: QuotaScope, project_ids: list[int], window: Window, exclude: int) -> QuotaScope:
    return replace(scope, usage=_window_usage(scope, project_ids, window, exclude))


def _scope_projects(project: Project, scope: QuotaScope) -> list[int]:
    if scope.name == "project":
        return [project.pk]
    return list(Project.objects.filter(tenant_id=project.tenant_id).values_list("pk", flat=True))


def _window_usage(scope: QuotaScope, project_ids: list[int], window: Window, exclude: int) -> dict:
    usage = dict.fromkeys(CONCURRENT, 0) | {D.GPUS: ZERO}
    starts_in = month_start(window.start.date())
    month_after = next_month_start(starts_in)
    reserved = _reservations(project_ids, before=max(window.end, _aware(month_after)), exclude=exclude)
    monthly = scope.usage[D.MONTHLY_CARD_HOURS] if starts_in == month_start() else ZERO
    for row in reserved:
        start, end = row["reserved_start"], row["reserved_start"] + timedelta(hours=row["duration_hours"])
        if window.overlaps(start, end):
            _add(usage, row)
        if starts_in != month_start() and month_start(start.date()) == starts_in:
            monthly += row["card_hours"]  # this month's usage counts those starting this month already
    held = _held_at(project_ids, window.start, exclude)
    for row in held:
        _add(usage, row)
    usage[D.MONTHLY_CARD_HOURS] = monthly
    return usage


_DEMAND_VALUES = ("gpu_equivalents", "accelerator_memory_gb", "cpu_cores", "memory_gb", "card_hours")


def _reservations(project_ids: list[int], *, before: datetime, exclude: int) -> list[dict]:
    return list(
        ResourceRequest.objects.filter(
            project_id__in=project_ids,
            state__in=COMMITTED_STATES,
            reserved_start__isnull=False,
            reserved_start__lt=before,
        )
        .exclude(pk=exclude)
        .values("reserved_start", "duration_hours", *_DEMAND_VALUES)
    )


def _held_at(project_ids: list[int], moment: datetime, exclude: int) -> list[dict]:
    """Work of these projects (not a reservation, counted by its window) that holds devices now and is expected to
    still hold them at `moment`: its approved end is later, or it has none."""
    ends = hooks.ask(hooks.HELD_ENDS, project_ids) or {}
    still = [pk for pk, end in ends.items() if pk != exclude and (end is None or end > moment)]
    if not still:
        return []
    return list(
        ResourceRequest.objects.filter(pk__in=still, reserved_start__isnull=True, state__in=HOLDING_STATES).values(
            *_DEMAND_VALUES
        )
    )


def _add(usage: dict, row: dict) -> None:
    usage[D.GPUS] += row["gpu_equivalents"]
    usage[D.ACCELERATOR_MEMORY_GB] += row["accelerator_memory_gb"]
    usage[D.CPU_CORES] += row["cpu_cores"]
    usage[D.MEMORY_GB] += row["memory_gb"]
    usage[D.CONCURRENT_TASKS] += 1


def _aware(day: date) -> datetime:
    return timezone.make_aware(datetime(day.year, day.month, day.day))


def earliest_window(*, order, sizing, window: Window) -> dict | None:
    """Scheduling's answer: the earliest start at or after the window's that fits the capacity (None while
    scheduling is not installed)."""
    return hooks.ask(hooks.EARLIEST_WINDOW, order, sizing, window.start, window.hours)


def check_capacity(*, order, sizing, window: Window) -> None:
    """Refuse a window whose capacity is taken, naming the earliest one that fits."""
    answer = earliest_window(order=order, sizing=sizing, window=window)
    if answer is not None and not answer["fits_asked"]:
        raise WindowTaken(answer["message"], details={"window": window.as_data(), "earliest_start": answer["start"]})


def lead_hours(window: Window, now: datetime) -> Decimal:
    """How long before its start a reservation was ordered, in hours (what approval rules condition on)."""
    return Decimal(int((window.start - now).total_seconds() // 60)) / 60
