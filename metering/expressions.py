"""Query expressions for card-hours and cost, portable to the embedded SQLite demo.

An allocation bound `gpu_equivalents` cards (whole cards count 1 each; a slice counts as its profile's fraction, as
in the quota) from `started_at` until `released_at`, or until now while it runs; for work the platform starts on an
execution backend (`metered_from_workload`: a compute order's Slurm job or container) the count starts when the
backend started it (`workload_started_at`), so a job that never started is charged nothing. Over a period its
card-hours are the seconds of the overlap times the cards / 3600, its cost the same seconds times the request's hourly
cost. A model-serving request's replicas each hold an allocation of their own: each counts for its part of the
request.
Arithmetic is in double precision (exact to far below the 0.0001 card-hour the results are rounded to, and several
times faster than numeric over a million rows).
"""

from datetime import datetime

from django.db.models import Case, ExpressionWrapper, F, FloatField, Func, Q, Value, When
from django.db.models.fields.json import KeyTextTransform, KeyTransform
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
    """Seconds of [start, end) during which the allocation reached through `prefix` was bound and metered (never
    negative)."""
    until = Least(Coalesce(F(f"{prefix}released_at"), Value(now)), Value(end))
    since = Greatest(metered_since(prefix, end), Value(start))
    return Greatest(Seconds(until - since), Value(0.0), output_field=NUMBER)


def metered_since(prefix: str, end: datetime):
    """When the allocation's card-hours start: its start, or its workload's start on the backend when it is metered
    from that (not started yet: `end`, so nothing of the period counts)."""
    return Case(
        When(
            **{f"{prefix}metered_from_workload": True},
            then=Coalesce(F(f"{prefix}workload_started_at"), Value(end)),
        ),
        default=F(f"{prefix}started_at"),
    )


def share_of_allocation():
    """On an AllocationDevice: its part of the allocation. The scheduler binds a request's accelerator_count units,
    each 1000 milli for a whole card or the slice profile's fraction in whole milli (scheduling.engine.MILLI)."""
    unit = Coalesce(
        Floor(_number("allocation__request__spec__slice_profile__compute_fraction") * 1000),
        Value(1000.0),
        output_field=NUMBER,
    )
    return ExpressionWrapper(
        _number("milli") / (F("allocation__request__accelerator_count") * unit), output_field=NUMBER
    )


def part_of_request(prefix: str):
    """On an Allocation: its part of the request's cards and cost. The request's gpu_equivalents and hourly cost are
    the whole deployment's (spec x replicas) or the whole gang's (spec x nodes); a replica's allocation holds one
    replica of them (1 / the approved replicas), a gang member's one node (1 / the approved nodes), any other
    allocation all of it."""
    snapshot = f"{prefix}request__approved_spec"
    replicas = Cast(KeyTextTransform("replicas", KeyTransform("serving", snapshot)), NUMBER)
    nodes = Cast(KeyTextTransform("nodes", KeyTransform("spec", snapshot)), NUMBER)
    return Case(
        When(**{f"{prefix}replica__isnull": False}, then=Value(1.0) / replicas),
        When(**{f"{prefix}member__isnull": False}, then=Value(1.0) / nodes),
        default=Value(1.0),
        output_field=NUMBER,
    )


def _per_hour(prefix: str, rate: str, start: datetime, end: datetime, now: datetime, share):
    """`share`: a device binding's part of its request (share_of_allocation); None: the allocation's part."""
    amount = bound_seconds(prefix, start, end, now) * _number(f"{prefix}request__{rate}") / 3600.0
    return ExpressionWrapper(amount * (part_of_request(prefix) if share is None else share), output_field=NUMBER)


def card_hours(prefix: str, start: datetime, end: datetime, now: datetime, share=None):
    return _per_hour(prefix, "gpu_equivalents", start, end, now, share)


def cost(prefix: str, start: datetime, end: datetime, now: datetime, share=None):
    return _per_hour(prefix, "hourly_cost", start, end, now, share)
