"""The engine's reasons in words people read: cores, GiB/TiB and cards (the milli and MiB it counts in stay in the
reasons' numbers), and a few node names for a sentence."""

from __future__ import annotations

from scheduling.engine.frag import MILLI


def names_text(names: list[str], shown: int = 5) -> str:
    """A few node names for a sentence, and how many more there are."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def cores_text(cpu_milli: int) -> str:
    return f"{in_units(cpu_milli, MILLI)} CPU cores"


def memory_text(memory_mib: int) -> str:
    gib = memory_mib / 1024
    return (
        f"{in_units(memory_mib, 1024 * 1024)} TiB memory" if gib >= 1024 else f"{in_units(memory_mib, 1024)} GiB memory"
    )


def cards_text(milli: int) -> str:
    cards = in_units(milli, MILLI)
    return f"{cards} card" if cards == 1 else f"{cards} cards"


def in_units(amount: int, unit: int) -> int | float:
    value = amount / unit
    return int(value) if value.is_integer() else round(value, 2)
