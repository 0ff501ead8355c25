"""Reads for the usage report: Slurm's books against the platform's meter per request, and the hours advance
reservations held with nothing running per project. Each one query, however many rows; what a user sees is limited
to the projects they may view (operators see all)."""

from datetime import date, datetime

from django.db.models import Count, ExpressionWrapper, F, Sum, Value
from django.db.models.functions import Cast, Coalesce, Greatest, Least
from django.utils import timezone

from metering.expressions import NUMBER, Seconds, card_hours, overlapping, part_of_request
from metering.models import SlurmBooks
from metering.periods import months
from metering.selectors import visible_projects
from scheduling.models import Allocation
from tenancy.models import User


def _window(first_month: date, last_month: date) -> tuple[datetime, datetime]:
    periods = months(first_month, last_month)
    return periods[0].start, periods[-1].end


def _projects(user: User, project_id: int | None):
    projects = visible_projects(user=user)
    return projects.filter(pk=project_id) if project_id else projects


def slurm_books_report(*, user: User, first_month: date, last_month: date, project_id: int | None = None) -> list[dict]:
    """The last reading of Slurm's books for each visible request that held cards in the months: Slurm's card-hours,
    the platform's, the difference (Slurm's minus the platform's), the jobs and whether the reading is final."""
    start, end = _window(first_month, last_month)
    rows = (
        SlurmBooks.objects.filter(
            request__project__in=_projects(user, project_id).values("pk"),
            request__in=Allocation.objects.filter(overlapping("", start, end)).values("request_id"),
        )
        .order_by("request_id")
        .values(
            "request_id",
            "request__project__slug",
            "jobs",
            "slurm_card_hours",
            "platform_card_hours",
            "difference_card_hours",
            "final",
            "read_at",
        )
    )
    return [
        {
            "request": row["request_id"],
            "project": row["request__project__slug"],
            "jobs": [job["job_id"] for job in row["jobs"]],
            "slurm_card_hours": row["slurm_card_hours"],
            "platform_card_hours": row["platform_card_hours"],
            "difference_card_hours": row["difference_card_hours"],
            "final": row["final"],
            "read_at": row["read_at"],
        }
        for row in rows
    ]


def reserved_idle_report(
    *, user: User, first_month: date, last_month: date, project_id: int | None = None, now=None
) -> list[dict]:
    """Per visible project, its advance reservations in the months: the card-hours they held (metered from the
    binding at the window's start) and, of those, the hours held with nothing running: until the workload started
    (a Slurm job's start as Slurm recorded it), or until the release for a no-show."""
    now = now or timezone.now()
    start, end = _window(first_month, last_month)
    rows = (
        Allocation.objects.filter(
            overlapping("", start, end),
            request__reserved_start__isnull=False,
            request__project__in=_projects(user, project_id).values("pk"),
        )
        .values(project=F("request__project__slug"))
        .annotate(
            reservations=Count("request_id", distinct=True),
            reserved_card_hours=Sum(card_hours("", start, end, now)),
            idle_card_hours=Sum(_idle_card_hours(start, end, now)),
        )
        .order_by("project")
    )
    return [
        {
            "project": row["project"],
            "reservations": row["reservations"],
            "reserved_card_hours": round(row["reserved_card_hours"] or 0.0, 4),
            "reserved_idle_card_hours": round(row["idle_card_hours"] or 0.0, 4),
        }
        for row in rows
    ]


def _idle_card_hours(start: datetime, end: datetime, now: datetime):
    """An allocation's card-hours in [start, end) from its binding until its workload started, or until it was
    released (now while it is held) when nothing ever started."""
    idle_until = Least(Coalesce(F("workload_started_at"), F("released_at"), Value(now)), Value(end))
    idle_since = Greatest(F("started_at"), Value(start))
    seconds = Greatest(Seconds(idle_until - idle_since), Value(0.0), output_field=NUMBER)
    return ExpressionWrapper(
        seconds * Cast("request__gpu_equivalents", NUMBER) * part_of_request("") / 3600.0, output_field=NUMBER
    )
