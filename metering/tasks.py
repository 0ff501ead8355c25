"""django-q2 entry points: take ids (here: nothing but the clock), call one service."""

from metering import services


def collect_telemetry() -> int:
    return services.telemetry_collect().samples


def refresh_usage() -> dict:
    return services.usage_refresh()


def refresh_telemetry() -> dict:
    return services.telemetry_refresh()
