"""What starts metering work: signals from scheduling, the hooks requests asks through, /metrics,
and the periodic schedules."""

from django.conf import settings
from django_q.models import Schedule
from django_q.tasks import async_task

from config import schedules

COLLECT_TASK = "metering.tasks.collect_telemetry"
USAGE_TASK = "metering.tasks.refresh_usage"
TELEMETRY_TASK = "metering.tasks.refresh_telemetry"
ENDED_TASK = "metering.tasks.refresh_ended_allocations"


def refresh_ended_allocations(*, allocation_ids: list[int], **_kwargs) -> None:
    """Allocations ended (a release, expiry, preemption, cleanup, whatever ended them): their card-hours are final,
    and the ledger holds them now, not at the next five-minute refresh."""
    async_task(ENDED_TASK, allocation_ids)


def record_cycle_duration(*, seconds: float, **_kwargs) -> None:
    async_task("metering.tasks.record_cycle_duration", seconds)


def ensure_schedules(**_kwargs) -> None:
    """Telemetry every sampling interval, the ledger and budgets every five minutes, rollups hourly."""
    every = max(1, settings.METERING_SAMPLE_INTERVAL_SECONDS // 60)
    schedules.ensure(
        ("Metering: collect telemetry", COLLECT_TASK, (Schedule.MINUTES, every)),
        ("Metering: card-hour ledger and budgets", USAGE_TASK, (Schedule.MINUTES, 5)),
        ("Metering: daily rollups and retention", TELEMETRY_TASK, schedules.HOURLY),
    )


def connect() -> None:
    from django.db.models.signals import post_migrate

    from config import metrics
    from metering.metrics import MeteringCollector
    from metering.selectors import request_usage, rightsizing_advice
    from requests import hooks
    from scheduling.signals import allocation_ended, cycle_finished

    hooks.register(hooks.RIGHTSIZING_ADVICE, rightsizing_advice)
    hooks.register(hooks.REQUEST_USAGE, request_usage)
    metrics.register(MeteringCollector())
    allocation_ended.connect(refresh_ended_allocations, dispatch_uid="metering.usage_on_allocation_end")
    cycle_finished.connect(record_cycle_duration, dispatch_uid="metering.cycle_duration")
    post_migrate.connect(ensure_schedules, dispatch_uid="metering.ensure_schedules")
