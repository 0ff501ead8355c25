"""Template filters for what a person reads: a reason code as words, amounts rounded as people count them."""

from django import template

from config import words
from requests import start_words
from requests.choices import PriorityClass

register = template.Library()


@register.filter
def code_in_words(code: str) -> str:
    """A machine code as words ("capacity_in_use" -> "capacity in use"); the code itself stays in data-code."""
    return str(code).replace("_", " ")


@register.filter
def expected_start(estimate) -> dict | None:
    """A stored or previewed start estimate with its sentence, said relative to now (requests/start_words.py)."""
    return start_words.expected_start(estimate)


@register.filter
def amount(value, places: int = 2) -> str:
    """8.00 -> 8, 0.1429 -> 0.14, 14.858 -> 14.86; empty for no value."""
    return "" if value in (None, "") else words.amount(value, places)


@register.filter
def priority_label(code: str) -> str:
    """A priority class by its label ("Batch (preemptible)"); an unknown code as it is."""
    return PriorityClass(code).label if code in PriorityClass.values else code


@register.filter
def priority_labels(codes) -> str:
    """Priority classes as a list in words: "Batch (preemptible), Standard and High"."""
    return words.listed([priority_label(code) for code in codes])
