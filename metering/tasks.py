"""django-q2 entry points: take ids (here: nothing but the clock, or a measured duration), call one service."""

from config.retry import retry_if_locked
from metering import services
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
