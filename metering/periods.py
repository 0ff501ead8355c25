"""Calendar periods of a report (UTC months and days). Pure: no database, no Django."""

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta


@dataclass(frozen=True)
class Period:
    label: str  # "2026-11" for a month, "2026-11-30" for a day
    start: datetime
    end: datetime  # exclusive


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def first_of_month(day: date) -> date:
    return day.replace(day=1)


def next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def month_period(month: date) -> Period:
    return Period(f"{month:%Y-%m}", midnight(month), midnight(next_month(month)))


def months(first: date, last: date) -> list[Period]:
    """Every month from the one holding `first` to the one holding `last`, both included."""
    periods, month = [], first_of_month(first)
    while month <= last:
        periods.append(month_period(month))
        month = next_month(month)
    return periods


def days_of_month(month: date) -> list[Period]:
    day, end, periods = first_of_month(month), next_month(month), []
    while day < end:
        periods.append(Period(f"{day:%Y-%m-%d}", midnight(day), midnight(day + timedelta(days=1))))
        day += timedelta(days=1)
    return periods


def add_months(month: date, count: int) -> date:
    """The first of the month `count` months after (or, negative, before) `month`'s."""
    index = month.year * 12 + month.month - 1 + count
    return date(index // 12, index % 12 + 1, 1)


def months_spanned(first: date, last: date) -> int:
    """How many months from `first`'s to `last`'s, both included (zero or less when `last` comes first)."""
    return (last.year - first.year) * 12 + last.month - first.month + 1


DEFAULT_MONTHS, MAX_MONTHS = 6, 36


def report_months(first: date | None, last: date | None, today: date) -> tuple[date, date]:
    """The months a report covers: by default the six up to this one; ValueError for a backwards or too long span."""
    last = first_of_month(last or today)
    first = first_of_month(first or add_months(last, 1 - DEFAULT_MONTHS))
    if months_spanned(first, last) < 1:
        raise ValueError("The first month comes after the last.")
    if months_spanned(first, last) > MAX_MONTHS:
        raise ValueError(f"At most {MAX_MONTHS} months at a time.")
    return first, last


def parse_month(text: str) -> date:
    """ "2026-11" -> date(2026, 11, 1); ValueError otherwise."""
    return datetime.strptime(text, "%Y-%m").date()
