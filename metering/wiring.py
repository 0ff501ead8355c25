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
IDLE_TASK = "metering.tasks.sweep_idle"
SLURM_BOOKS_TASK = "metering.tasks.read_slurm_books"
AGENT_READINGS_TASK = "metering.tasks.store_agent_readings"


def refresh_ended_allocations(*, allocation_ids: list[int], **_kwargs) -> None:
    """Allocations ended (a release, expiry, preemption, cleanup, whatever ended them): their card-hours are final,
    and the ledger holds them now, not at the next five-minute refresh."""
    async_task(ENDED_TASK, allocation_ids)


def store_agent_readings(*, readings: dict[int, dict[str, float]], at, **_kwargs) -> None:
    """Agents pushed card readings through the health API: kept as telemetry (idle detection reads them)."""
    async_task(AGENT_READINGS_TASK, {str(device_id): values for device_id, values in readings.items()}, at.isoformat())


def record_cycle_duration(*, seconds: float, **_kwargs) -> None:
    async_task("metering.tasks.record_cycle_duration", seconds)


def ensure_schedules(**_kwargs) -> None:
    """Telemetry every sampling interval, the ledger, budgets and idle sweep every five minutes, rollups hourly,
    Slurm's books every SLURM_BOOKS_MINUTES."""
    every = max(1, settings.METERING_SAMPLE_INTERVAL_SECONDS // 60)
    schedules.ensure(
        ("Metering: collect telemetry", COLLECT_TASK, (Schedule.MINUTES, every)),
        ("Metering: card-hour ledger and budgets", USAGE_TASK, (Schedule.MINUTES, 5)),
        ("Metering: daily rollups and retention", TELEMETRY_TASK, schedules.HOURLY),
        ("Metering: idle warnings and stops", IDLE_TASK, schedules.EVERY_FIVE_MINUTES),
        ("Metering: Slurm's books", SLURM_BOOKS_TASK, (Schedule.MINUTES, settings.SLURM_BOOKS_MINUTES)),
    )


def connect() -> None:
    from django.db.models.signals import post_migrate

    from config import metrics
    from metering.idle.selectors import idle_status
    from metering.metrics import MeteringCollector
    from metering.selectors import request_usage, rightsizing_advice
    from requests import hooks
    from scheduling.signals import allocation_ended, cycle_finished, device_readings

    hooks.register(hooks.RIGHTSIZING_ADVICE, rightsizing_advice)
    hooks.register(hooks.REQUEST_USAGE, request_usage)
    hooks.register(hooks.IDLE_STATUS, idle_status)
    metrics.register(MeteringCollector())
    allocation_ended.connect(refresh_ended_allocations, dispatch_uid="metering.usage_on_allocation_end")
    cycle_finished.connect(record_cycle_duration, dispatch_uid="metering.cycle_duration")
    device_readings.connect(store_agent_readings, dispatch_uid="metering.agent_readings")
    post_migrate.connect(ensure_schedules, dispatch_uid="metering.ensure_schedules")
