"""django-q2 entry points: take ids (here: nothing but the clock, a measured duration, or an agent's readings), call
one service."""

from datetime import datetime

from config.retry import retry_if_locked
from metering import services
from metering.books import services as books
from metering.idle import services as idle_services
from metering.metrics import SCHEDULER_CYCLE_BOUNDS, SCHEDULER_CYCLE_SECONDS


@retry_if_locked
def collect_telemetry() -> int:
    return services.telemetry_collect().samples


@retry_if_locked
def refresh_usage() -> dict:
    return services.usage_refresh()


@retry_if_locked
def refresh_ended_allocations(allocation_ids: list[int]) -> dict:
    return services.ended_allocations_refresh(allocation_ids=allocation_ids)


@retry_if_locked
def refresh_telemetry() -> dict:
    return services.telemetry_refresh()


@retry_if_locked
def record_cycle_duration(seconds: float) -> None:
    services.duration_observe(metric=SCHEDULER_CYCLE_SECONDS, seconds=seconds, bounds=SCHEDULER_CYCLE_BOUNDS)


def mail_budget_alert(alert_id: int) -> int:
    return services.budget_alert_mail(alert_id=alert_id)


@retry_if_locked
def store_agent_readings(readings: dict[str, dict[str, float]], at: str) -> int:
    return services.telemetry_from_agents(
        readings={int(device_id): values for device_id, values in readings.items()}, at=datetime.fromisoformat(at)
    ).samples


@retry_if_locked
def sweep_idle() -> dict:
    return idle_services.idle_sweep().as_dict()


@retry_if_locked
def read_slurm_books() -> dict:
    return books.slurm_books_refresh()
