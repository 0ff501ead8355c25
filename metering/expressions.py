"""Query expressions for card-hours and cost, portable to the embedded SQLite demo.

An allocation bound `gpu_equivalents` cards (whole cards count 1 each; a slice counts as its profile's fraction, as
in the quota) from `started_at` until `released_at`, or until now while it runs. Over a period its card-hours are
the seconds of the overlap times the cards / 3600, its cost the same seconds times the request's hourly cost.
Arithmetic is in double precision (exact to far below the 0.0001 card-hour the results are rounded to, and several
times faster than numeric over a million rows).
"""

from datetime import datetime

from django.db.models import ExpressionWrapper, F, FloatField, Func, Q, Value
from django.db.models.functions import Cast, Coalesce, Floor, Greatest, Least

NUMBER = FloatField()


class Seconds(Func):
    """A duration (the difference of two timestamps) as a number of seconds."""

    output_field = NUMBER

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(
            compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::double precision", **extra
        )

    def as_sqlite(self, compiler, connection, **extra):  # Django keeps SQLite durations in microseconds
        return self.as_sql(compiler, connection, template="(%(expressions)s / 1000000.0)", **extra)


def _number(field: str):
    return Cast(field, NUMBER)


def overlapping(prefix: str, start: datetime, end: datetime) -> Q:
    """Allocations (reached through `prefix`) bound at some moment of [start, end)."""
    return Q(**{f"{prefix}started_at__lt": end}) & (
        Q(**{f"{prefix}released_at__isnull": True}) | Q(**{f"{prefix}released_at__gt": start})
    )


def bound_seconds(prefix: str, start: datetime, end: datetime, now: datetime):
    """Seconds of [start, end) during which the allocation reached through `prefix` was bound (never negative)."""
    until = Least(Coalesce(F(f"{prefix}released_at"), Value(now)), Value(end))
    since = Greatest(F(f"{prefix}started_at"), Value(start))
    return Greatest(Seconds(until - since), Value(0.0), output_field=NUMBER)


def share_of_allocation():
    """On an AllocationDevice: its part of the allocation. The scheduler binds a request's accelerator_count units,
    each 1000 milli for a whole card or the slice profile's fraction in whole milli (placement.MILLI)."""
    unit = Coalesce(
        Floor(_number("allocation__request__spec__slice_profile__compute_fraction") * 1000),
        Value(1000.0),
        output_field=NUMBER,
    )
    return ExpressionWrapper(
        _number("milli") / (F("allocation__request__accelerator_count") * unit), output_field=NUMBER
    )


def _per_hour(prefix: str, rate: str, start: datetime, end: datetime, now: datetime, share):
    amount = bound_seconds(prefix, start, end, now) * _number(f"{prefix}request__{rate}") / 3600.0
    return ExpressionWrapper(amount if share is None else amount * share, output_field=NUMBER)


def card_hours(prefix: str, start: datetime, end: datetime, now: datetime, share=None):
    return _per_hour(prefix, "gpu_equivalents", start, end, now, share)


def cost(prefix: str, start: datetime, end: datetime, now: datetime, share=None):
    return _per_hour(prefix, "hourly_cost", start, end, now, share)
