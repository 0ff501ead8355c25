"""Numbers in telemetry: which values can be used as numbers at all. Pure; imports nothing from Django.

A reading arrives as a float (dcgm-exporter text), a JSON number of any size, or text. NaN, the infinities and
magnitudes beyond any counter an exporter has are refused where they arrive, so no rule, sample or response ever
meets one.
"""

import math
from typing import Any

# dcgm-exporter's widest fields are unsigned 64-bit counters: a larger magnitude is a broken exporter, not a reading.
MAX_MAGNITUDE = 2.0**64


def _as_float(value: Any) -> float | None:
    """The number a value reads as (NaN and infinities included), or None for text that is no number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:  # float() of a larger int may overflow; its sign is all that matters
            return math.inf if value > 0 else -math.inf
        return float(value)
    if isinstance(value, float):
        return value
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def number_problem(value: Any) -> str | None:
    """Why a value cannot be used as a number (NaN, infinite, out of range), or None when it can (or is text,
    which rules compare as text)."""
    number = _as_float(value)
    if number is None:
        return None
    if math.isnan(number):
        return "is not a number (NaN)"
    if math.isinf(number) and not isinstance(value, int):  # an int too large for a float is finite, only too large
        return "is infinite"
    if abs(number) > MAX_MAGNITUDE:
        return f"is beyond ±{MAX_MAGNITUDE:.3g}"
    return None


def usable_number(value: Any) -> float | None:
    """The value as a number when it is a usable one, else None."""
    number = _as_float(value)
    return number if number is not None and number_problem(value) is None else None
