"""Every metering write: telemetry samples and their daily rollups, the quota ledger, budget alerts, durations.

Tasks call these with times only. Each is idempotent (samples are unique per binding and instant, rollups and the
ledger are recomputed and upserted, an alert exists once per project, month and level), so a task that runs twice
or on two workers at once does no harm.
"""

import logging
import math
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone
from django_q.tasks import async_task

from config.mail import absolute_url
from metering import selectors
from metering.choices import BudgetLevel
from metering.models import BudgetAlert, DailyUsage, HistogramBucket, TelemetrySample
from metering.periods import first_of_month, midnight, month_period, next_month
from metering.telemetry import Reading, agent_readings, telemetry_driver
from requests.choices import RUNNING_STATES, NotificationKind
from requests.models import ResourceRequest
from requests.notifications import people_notify
from requests.services import request_release
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device
from tenancy.models import MonthlyUsage, Project
from tenancy.services import audit_record

logger = logging.getLogger(__name__)


# --- Telemetry ------------------------------------------------------------------------------------------------


@dataclass
class CollectReport:
    instant: datetime
    samples: int
    errors: list[str] = field(default_factory=list)


def sampling_instant(now: datetime) -> datetime:
    """`now` rounded down to the sampling interval: a collector run twice in one interval stores nothing twice."""
    interval = settings.METERING_SAMPLE_INTERVAL_SECONDS
    return datetime.fromtimestamp(int(now.timestamp()) // interval * interval, tz=now.tzinfo)


def sample_of(reading: Reading, instant: datetime) -> TelemetrySample:
    return TelemetrySample(
        allocation_id=reading.allocation_id,
        device_id=reading.device_id,
        sampled_at=instant,
        utilization_pct=reading.utilization_pct,
        memory_used_mb=reading.memory_used_mb,
        power_w=reading.power_w,
    )


def telemetry_collect(*, now: datetime | None = None, driver=None) -> CollectReport:
    """Store one sample per binding of the running allocations, each read by its vendor's or node's driver."""
    instant = sampling_instant(now or timezone.now())
    running = Allocation.objects.filter(state=AllocationState.ACTIVE)
    result = (driver or telemetry_driver()).read(selectors.bindings_of(running), instant)
    TelemetrySample.objects.bulk_create(
        [sample_of(reading, instant) for reading in result.readings], batch_size=5000, ignore_conflicts=True
    )
    for error in result.errors:
        logger.warning("Telemetry: %s", error)
    return CollectReport(instant, len(result.readings), result.errors)


def telemetry_from_agents(*, readings: dict[int, dict[str, float]], at: datetime) -> CollectReport:
    """Store what node agents pushed through the health API (device id -> {dcgm signal: value}) as samples of the
    running allocations on those devices, at the sampling instant of `at` (a collector's sample of the same instant
    wins: one sample per binding and instant)."""
    instant = sampling_instant(at)
    running = Allocation.objects.filter(state=AllocationState.ACTIVE, devices__device_id__in=list(readings)).distinct()
    result = agent_readings(selectors.bindings_of(running), readings)
    TelemetrySample.objects.bulk_create(
        [sample_of(reading, instant) for reading in result.readings], ignore_conflicts=True
    )
    for error in result.errors:
        logger.warning("Agent telemetry: %s", error)
    return CollectReport(instant, len(result.readings), result.errors)


# Per allocation and instant, the devices are added up; per allocation and UTC day, the instants are summarised.
# Energy: trapezoids between a device's consecutive samples, skipped across gaps longer than max_gap (the collector
# was down; nothing is known), counted on the day of the later sample. Percentiles are nearest-rank, through
# CUME_DIST, so the statement runs on PostgreSQL and on the embedded SQLite alike.
_ROLLUP = """
WITH readings AS (
    SELECT s.allocation_id, s.device_id, s.sampled_at, s.utilization_pct, s.memory_used_mb, s.power_w,
           LAG(s.sampled_at) OVER (PARTITION BY s.allocation_id, s.device_id ORDER BY s.sampled_at) AS previous_at,
           LAG(s.power_w) OVER (PARTITION BY s.allocation_id, s.device_id ORDER BY s.sampled_at) AS previous_power
    FROM {samples} s
    WHERE s.sampled_at >= %(lookback)s AND s.sampled_at <= %(until)s
), instants AS (
    SELECT r.allocation_id, r.sampled_at, MIN(d.model_id) AS model_id, COUNT(*) AS devices,
           SUM(r.utilization_pct) AS utilization, SUM(r.memory_used_mb) AS memory_mb,
           SUM(CASE WHEN {gap} <= %(max_gap)s THEN (r.power_w + r.previous_power) / 2 * {gap} ELSE 0 END) AS joules
    FROM readings r JOIN {devices} d ON d.id = r.device_id
    WHERE r.sampled_at >= %(since)s
    GROUP BY r.allocation_id, r.sampled_at
), ranked AS (
    SELECT i.*, {day} AS day,
           CUME_DIST() OVER (PARTITION BY i.allocation_id, {day} ORDER BY i.utilization) AS utilization_rank,
           CUME_DIST() OVER (PARTITION BY i.allocation_id, {day} ORDER BY i.memory_mb) AS memory_rank
    FROM instants i
)
INSERT INTO {daily} (allocation_id, day, accelerator_model_id, samples, device_samples, utilization_sum,
                     busy_cards_p95, memory_sum_mb, memory_p95_mb, memory_max_mb, energy_kwh, updated_at)
SELECT allocation_id, day, MIN(model_id), COUNT(*), SUM(devices), SUM(utilization),
       MIN(CASE WHEN utilization_rank >= 0.95 THEN utilization END) / 100.0,
       SUM(memory_mb), MIN(CASE WHEN memory_rank >= 0.95 THEN memory_mb END), MAX(memory_mb),
       SUM(joules) / 3600000.0, %(now)s
FROM ranked WHERE 1 = 1
GROUP BY allocation_id, day
ON CONFLICT (allocation_id, day) DO UPDATE SET
    accelerator_model_id = excluded.accelerator_model_id, samples = excluded.samples,
    device_samples = excluded.device_samples, utilization_sum = excluded.utilization_sum,
    busy_cards_p95 = excluded.busy_cards_p95, memory_sum_mb = excluded.memory_sum_mb,
    memory_p95_mb = excluded.memory_p95_mb, memory_max_mb = excluded.memory_max_mb,
    energy_kwh = excluded.energy_kwh, updated_at = excluded.updated_at
"""

_VENDOR_SQL = {
    "postgresql": {
        "gap": "EXTRACT(EPOCH FROM (r.sampled_at - r.previous_at))",
        "day": "CAST(i.sampled_at AT TIME ZONE 'UTC' AS date)",
    },
    "sqlite": {"gap": "((julianday(r.sampled_at) - julianday(r.previous_at)) * 86400.0)", "day": "date(i.sampled_at)"},
}


def max_gap_seconds() -> int:
    return 3 * settings.METERING_SAMPLE_INTERVAL_SECONDS


@transaction.atomic
def telemetry_rollup(*, first_day: date, now: datetime | None = None) -> int:
    """(Re)compute the daily rollup of every day from `first_day` to now from the raw samples; returns how many
    rollup rows those days have."""
    now = now or timezone.now()
    since = midnight(first_day)
    sql = _ROLLUP.format(
        samples=TelemetrySample._meta.db_table,
        devices=Device._meta.db_table,
        daily=DailyUsage._meta.db_table,
        **_VENDOR_SQL[connection.vendor],
    )
    adapt = connection.ops.adapt_datetimefield_value
    params = {
        "lookback": adapt(since - timedelta(seconds=max_gap_seconds())),
        "since": adapt(since),
        "until": adapt(now),
        "max_gap": max_gap_seconds(),
        "now": adapt(now),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    return DailyUsage.objects.filter(day__gte=first_day).count()


def telemetry_prune(*, now: datetime | None = None) -> int:
    """Delete raw samples older than the retention. At least two days are kept: the hourly rollup recomputes
    yesterday and today from them."""
    days = max(settings.METERING_SAMPLE_RETENTION_DAYS, 2)
    cutoff = midnight((now or timezone.now()).date() - timedelta(days=days))
    deleted, _ = TelemetrySample.objects.filter(sampled_at__lt=cutoff).delete()
    return deleted


# --- Quota ledger and budgets ----------------------------------------------------------------------------------


@transaction.atomic
def ledger_refresh(*, months: list[date], now: datetime | None = None, project_ids: list[int] | None = None) -> int:
    """Recompute tenancy.MonthlyUsage (card-hours per project and month, running allocations up to now) for the
    given months from the allocations, and store it; returns the rows written. The current month's rows also get
    what running requests have metered so far (`running_card_hours`), as of the same `now`. Every project, or only
    those of `project_ids`."""
    now = now or timezone.now()
    this_month = first_of_month(now.date())
    periods = {month_period(month).label: first_of_month(month) for month in months}
    hours = selectors.card_hours_by_project(
        periods=[month_period(month) for month in periods.values()], now=now, project_ids=project_ids
    )
    running = (
        selectors.running_card_hours_by_project(now=now, project_ids=project_ids)
        if this_month in periods.values()
        else {}
    )
    rows = {
        (project_id, periods[label]): MonthlyUsage(project_id=project_id, month=periods[label], card_hours=value)
        for (project_id, label), value in hours.items()
    }
    for project_id, value in running.items():
        rows.setdefault((project_id, this_month), MonthlyUsage(project_id=project_id, month=this_month))
        rows[project_id, this_month].running_card_hours = value
    MonthlyUsage.objects.bulk_create(
        rows.values(),
        update_conflicts=True,
        unique_fields=["project", "month"],
        update_fields=["card_hours", "running_card_hours", "updated_at"],
    )
    return len(rows)


BUDGET_MAIL_TASK = "metering.tasks.mail_budget_alert"


def budget_thresholds() -> dict[str, Decimal]:
    """The share of the monthly budget at which each level is reached; the warning's is the operators' to set."""
    return {
        BudgetLevel.WARNING: Decimal(settings.METERING_BUDGET_WARNING_PERCENT) / 100,
        BudgetLevel.EXHAUSTED: Decimal(1),
    }


def _reached(used, limit) -> list[str]:
    return [level for level, share in budget_thresholds().items() if used >= limit * share]


def budgets_check(*, month: date, project_ids: list[int] | None = None) -> list[BudgetAlert]:
    """Announce once each budget level a project (of `project_ids`, or any) has reached this month, from the ledger;
    returns new alerts."""
    month = first_of_month(month)
    usage = MonthlyUsage.objects.filter(month=month, card_hours__gt=0, project__quota__monthly_card_hours__isnull=False)
    if project_ids is not None:
        usage = usage.filter(project_id__in=project_ids)
    usage = usage.values_list("project_id", "card_hours", "project__quota__monthly_card_hours")
    announced = set(BudgetAlert.objects.filter(month=month).values_list("project_id", "level"))
    alerts = []
    for project_id, used, limit in usage:
        for level in _reached(used, limit):
            if (project_id, level) not in announced:
                alert = budget_alert_record(project_id=project_id, month=month, level=level, used=used, limit=limit)
                alerts += [alert] if alert is not None else []
    return alerts


@transaction.atomic
def budget_alert_record(*, project_id: int, month: date, level: str, used, limit) -> BudgetAlert | None:
    """Store the alert and its audit row on the project; None when another run stored it first. At 100%, running
    work is released only when METERING_BUDGET_RELEASES_RUNNING says so."""
    alert, created = BudgetAlert.objects.get_or_create(
        project_id=project_id, month=month, level=level, defaults={"card_hours": used, "limit": limit}
    )
    if not created:
        return None
    project = Project.objects.select_related("tenant").get(pk=project_id)
    message = (
        f"{project} used {used:.1f} of its {limit:.0f} card-hours for {month:%B %Y}: "
        f"{BudgetLevel(level).label.lower()}."
    )
    audit_record(
        actor=None,
        action=f"budget.{level}",
        target=project,
        reason=message,
        data={"month": f"{month:%Y-%m}", "card_hours": used, "limit": limit},
    )
    transaction.on_commit(lambda: async_task(BUDGET_MAIL_TASK, alert.pk))
    if level == BudgetLevel.EXHAUSTED and settings.METERING_BUDGET_RELEASES_RUNNING:
        for request in ResourceRequest.objects.filter(project_id=project_id, state__in=RUNNING_STATES):
            request_release(request=request, actor=None, reason=f"monthly card-hour budget used up ({message})")
    return alert


def budget_alert_mail(*, alert_id: int) -> int:
    """Mail the project's lead that it reached a budget level (once per alert, unless they turned it off)."""
    alert = BudgetAlert.objects.select_related("project__lead", "project__tenant").get(pk=alert_id)
    project = alert.project
    return people_notify(
        people=[project.lead],
        kind=NotificationKind.BUDGET_WARNING,
        key=f"budget_alert:{alert.pk}",
        subject=f"{project.name}: {alert.percent}% of its monthly card-hour budget used",
        template="metering/mail/budget_alert",
        context={
            "alert": alert,
            "project": project,
            "exhausted": alert.level == BudgetLevel.EXHAUSTED,
            "releases_running": settings.METERING_BUDGET_RELEASES_RUNNING,
            "usage_url": absolute_url(reverse("metering:usage")),
        },
    )


def usage_refresh(*, now: datetime | None = None) -> dict:
    """The ledger of this month and the last (allocations running over the turn of the month end there), then
    this month's budget levels."""
    now = now or timezone.now()
    this_month = first_of_month(now.date())
    last_month = first_of_month(this_month - timedelta(days=1))
    rows = ledger_refresh(months=[last_month, this_month], now=now)
    alerts = budgets_check(month=this_month)
    return {"ledger_rows": rows, "alerts": [str(alert) for alert in alerts]}


def ended_allocations_refresh(*, allocation_ids: list[int], now: datetime | None = None) -> dict:
    """Allocations ended (scheduling's allocation_ended): the ledger rows they count in, their projects' in each
    month they were bound, are final at once, and those projects' budget levels of this month are checked; the
    five-minute refresh no longer has anything of theirs to catch up."""
    now = now or timezone.now()
    this_month = first_of_month(now.date())
    spans = Allocation.objects.filter(pk__in=allocation_ids).values_list(
        "request__project_id", "started_at", "released_at"
    )
    project_ids, bound_months = set(), set()
    for project_id, started_at, released_at in spans:
        project_ids.add(project_id)
        month = first_of_month(started_at.date())
        while month <= (released_at or now).date():
            bound_months.add(month)
            month = next_month(month)
    if not project_ids:
        return {"ledger_rows": 0, "alerts": []}
    projects = sorted(project_ids)
    rows = ledger_refresh(months=sorted(bound_months), now=now, project_ids=projects)
    alerts = budgets_check(month=this_month, project_ids=projects) if this_month in bound_months else []
    return {"ledger_rows": rows, "alerts": [str(alert) for alert in alerts]}


def telemetry_refresh(*, now: datetime | None = None) -> dict:
    """Roll up yesterday and today, then drop raw samples past their retention."""
    now = now or timezone.now()
    rows = telemetry_rollup(first_day=now.date() - timedelta(days=1), now=now)
    return {"rollup_rows": rows, "pruned": telemetry_prune(now=now)}


# --- Durations for /metrics -------------------------------------------------------------------------------------


def duration_observe(*, metric: str, seconds: float, bounds: tuple[float, ...]) -> None:
    """Count one observation in every cumulative bucket it falls in: one upsert, which also creates the buckets."""
    table = HistogramBucket._meta.db_table
    buckets = [(metric, le, int(seconds <= le), seconds if le == math.inf else 0.0) for le in (*bounds, math.inf)]
    rows = ", ".join(["(%s, %s, %s, %s)"] * len(buckets))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (metric, le, count, sum_seconds) VALUES {rows} "
            f"ON CONFLICT (metric, le) DO UPDATE SET count = {table}.count + excluded.count, "
            f"sum_seconds = {table}.sum_seconds + excluded.sum_seconds",
            [value for bucket in buckets for value in bucket],
        )
