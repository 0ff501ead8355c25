"""django-q2 entry points: take ids (here: nothing but the clock), call one service."""

from config.retry import retry_if_locked
from metering import services


@retry_if_locked
def collect_telemetry() -> int:
    return services.telemetry_collect().samples


@retry_if_locked
def refresh_usage() -> dict:
    return services.usage_refresh()


@retry_if_locked
def refresh_telemetry() -> dict:
    return services.telemetry_refresh()
