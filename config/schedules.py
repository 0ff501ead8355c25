"""Periodic django-q2 schedules that apps create after migrate (once: operators may retime them in the admin)."""

from django_q.models import Schedule

EVERY_MINUTE = (Schedule.MINUTES, 1)
EVERY_FIVE_MINUTES = (Schedule.MINUTES, 5)
HOURLY = (Schedule.HOURLY, None)


def ensure(*schedules: tuple[str, str, tuple[str, int | None]]) -> None:
    """Each (name, task path, (schedule type, minutes)) exists, repeating forever."""
    for name, func, (kind, minutes) in schedules:
        Schedule.objects.get_or_create(
            func=func, defaults={"name": name, "schedule_type": kind, "minutes": minutes, "repeats": -1}
        )
