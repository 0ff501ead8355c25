"""Order parameters: each service declares the keys an order may carry, and every order is checked against it.

A schema is a list (its order is the order form's order) of entries such as
    {"name": "rate_limit_per_minute", "type": "int", "min": 1, "max": 100000000, "label": "...", "help": "..."}
with `type` one of int, number, string, bool, enum; `min`/`max` for numbers, `max_length` for strings,
`choices` for enums, and `required`/`default` for any. Keys the schema does not name are refused, so whatever
an order carries is known, bounded and survives the snapshot and JSON round trips.
"""

import math
import re
from typing import Any

from config.errors import DomainError
from config.jsonvalues import as_stored
from config.ssh_keys import ssh_public_key_problem

# Limits that hold whatever a schema says: they bound the stored order and the schema itself.
MAX_KEYS = 50
MAX_KEY_LENGTH = 64
MAX_STRING_LENGTH = 1000
# Beyond 2**53 a JSON number is no longer exact in every client (JavaScript, jq): no range may reach past it.
MAX_MAGNITUDE = 2**53

NAME_PATTERN = re.compile(rf"^[a-z][a-z0-9_]{{0,{MAX_KEY_LENGTH - 1}}}$")
TYPES = ("int", "number", "string", "bool", "enum")
ENTRY_KEYS = {"name", "type", "label", "help", "required", "default", "min", "max", "max_length", "choices"}
# The order's own fields: a parameter of the same name would shadow them in the order form.
RESERVED_NAMES = frozenset(
    {
        "service",
        "project",
        "spec",
        "image",
        "bare_metal_profile",
        "serving_model",
        "serving_template",
        "duration_hours",
        "priority",
        "justification",
        "parameters",
        "over_quota",
        "csrfmiddlewaretoken",
    }
)

ENVIRONMENT = {
    "name": "environment",
    "type": "enum",
    "label": "Environment",
    "default": "development",
    "choices": ["development", "staging", "production"],
    "help": "Approval rules may ask for more sign-off in production.",
}
WORKLOAD = {
    "name": "workload",
    "type": "string",
    "max_length": 120,
    "label": "Workload",
    "help": "What runs, in a few words (training, inference, notebook...).",
}
SSH_PUBLIC_KEY = {
    "name": "ssh_public_key",  # the name carries the rule: ssh_public_key_problem, at order time and at start
    "type": "string",
    "max_length": MAX_STRING_LENGTH,
    "label": "SSH public key",
    "help": "One OpenSSH public key line (ssh-ed25519 AAAA...): a container workspace lets it log in.",
}
RATE_LIMIT = {
    "name": "rate_limit_per_minute",
    "type": "int",
    "min": 1,
    "max": 100_000_000,
    "label": "Rate limit (requests/minute)",
    "help": "Per API key. Empty: the platform default.",
}
TOKEN_BUDGET = {
    "name": "monthly_token_budget",
    "type": "int",
    "min": 1,
    "max": 10**15,
    "label": "Monthly token budget",
    "help": "Input + output tokens a month. Empty: no budget.",
}


def default_parameter_schema() -> list[dict]:
    """What a service accepts unless an operator declares otherwise."""
    return [dict(ENVIRONMENT), dict(WORKLOAD)]


def serving_parameter_schema() -> list[dict]:
    """A model-serving service's parameters: the default ones and the endpoint's limits."""
    return [*default_parameter_schema(), dict(RATE_LIMIT), dict(TOKEN_BUDGET)]


class ParameterInvalid(DomainError):
    status_code = 422
    code = "parameter_invalid"


def _refuse(code: str, message: str, **details) -> None:
    raise ParameterInvalid(message, code=code, details={"field": "parameters", **details})


def _shown(value: Any) -> str:
    """A key or value as a message may quote it: never the whole of a 10,000-character key or a huge number
    (whose decimal text Python refuses to build past 4,300 digits)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit number"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_KEY_LENGTH else text[:MAX_KEY_LENGTH] + "…"


# --- Orders ------------------------------------------------------------------------------------------------


def parameters_clean(schema: list[dict], parameters: Any) -> dict[str, Any]:
    """The order's parameters checked against the schema, with defaults filled in and numbers in the form the
    database gives them back; refuses (422) naming the key and the rule it breaks."""
    if not isinstance(parameters, dict):
        _refuse("parameter_invalid", "Parameters must be an object of key: value.", rule="type")
    if len(parameters) > MAX_KEYS:
        _refuse(
            "parameters_too_large",
            f"At most {MAX_KEYS} parameters.",
            rule="max_keys",
            maximum=MAX_KEYS,
            given=len(parameters),
        )
    entries = {entry["name"]: entry for entry in schema}
    for key in parameters:
        if key not in entries:
            _refuse(
                "parameter_unknown",
                f"{_shown(key)!r} is not a parameter of this service; it accepts {', '.join(entries) or 'none'}.",
                parameter=_shown(key),
                rule="unknown",
                allowed=list(entries),
            )
    cleaned = {}
    for name, entry in entries.items():
        if name in parameters and parameters[name] is not None:
            cleaned[name] = parameter_value_clean(entry, parameters[name])
        elif "default" in entry:
            cleaned[name] = entry["default"]
        elif entry.get("required"):
            _refuse("parameter_invalid", f"{name} is required.", parameter=name, rule="required")
    return cleaned


def parameter_value_clean(entry: dict, value: Any) -> Any:
    """One value checked against its schema entry (type, range, length, choices)."""
    name, kind = entry["name"], entry["type"]
    if kind == "bool":
        return _checked(isinstance(value, bool), value, name, "true or false")
    if kind == "string":
        return _clean_string(entry, value)
    if kind == "enum":
        return _checked(
            isinstance(value, str) and value in entry["choices"],
            value,
            name,
            f"one of {', '.join(entry['choices'])}",
            choices=entry["choices"],
        )
    return _clean_number(entry, value)


def _checked(ok: bool, value: Any, name: str, expected: str, **details) -> Any:
    if not ok:
        _refuse(
            "parameter_invalid",
            f"{name} must be {expected}, not {_shown(value)}.",
            parameter=name,
            rule="type",
            **details,
        )
    return value


def _clean_string(entry: dict, value: Any) -> str:
    name, limit = entry["name"], entry.get("max_length", MAX_STRING_LENGTH)
    _checked(isinstance(value, str), value, name, "text")
    if len(value) > limit:
        _refuse(
            "parameter_invalid",
            f"{name} is {len(value)} characters long; at most {limit}.",
            parameter=name,
            rule="max_length",
            maximum=limit,
            given=len(value),
        )
    if "\x00" in value:  # PostgreSQL text cannot hold it
        _refuse("parameter_invalid", f"{name} contains a NUL character.", parameter=name, rule="characters")
    if name == SSH_PUBLIC_KEY["name"] and value.strip():  # blank: no key (the schema's `required` decides)
        problem = ssh_public_key_problem(value)
        if problem:
            _refuse("parameter_invalid", f"{name} {problem}.", parameter=name, rule="ssh_public_key")
        return value.strip()
    return value


def _is_number(value: Any) -> bool:
    """A finite JSON number (bool is an int to Python, not to JSON)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _clean_number(entry: dict, value: Any) -> int | float:
    name, whole = entry["name"], entry["type"] == "int"
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    _checked(_is_number(value) and (integral or not whole), value, name, "a whole number" if whole else "a number")
    value = as_stored(int(value) if whole else value)
    # A whole number past 2**53 is not exact in every client; a float is as exact as it ever was.
    minimum = entry.get("min", -MAX_MAGNITUDE if whole else None)
    maximum = entry.get("max", MAX_MAGNITUDE if whole else None)
    if minimum is not None and value < minimum:
        _refuse(
            "parameter_invalid",
            f"{name} must be at least {minimum}, not {_shown(value)}.",
            parameter=name,
            rule="min",
            minimum=minimum,
        )
    if maximum is not None and value > maximum:
        _refuse(
            "parameter_invalid",
            f"{name} must be at most {maximum}, not {_shown(value)}.",
            parameter=name,
            rule="max",
            maximum=maximum,
        )
    return value


# --- The schema itself (operators edit it in the admin) -------------------------------------------------------


def schema_problems(schema: Any) -> list[str]:
    """Everything wrong with a schema, as sentences; empty when it can be used."""
    if not isinstance(schema, list):
        return ["The schema must be a list of parameter entries."]
    if len(schema) > MAX_KEYS:
        return [f"At most {MAX_KEYS} parameters."]
    problems, seen = [], set()
    for position, entry in enumerate(schema, start=1):
        for problem in _entry_problems(entry, seen):
            problems.append(f"Entry {position}: {problem}")
    return problems


def _entry_problems(entry: Any, seen: set[str]) -> list[str]:
    if not isinstance(entry, dict):
        return ["must be an object with at least name and type."]
    name, kind = entry.get("name"), entry.get("type")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return [f"name must be lower-case letters, digits and _ (starting with a letter, at most {MAX_KEY_LENGTH})."]
    if name in RESERVED_NAMES or name in seen:
        return [f"{name} is {'a field of every order' if name in RESERVED_NAMES else 'declared twice'}."]
    seen.add(name)
    if kind not in TYPES:
        return [f"{name}: type must be one of {', '.join(TYPES)}."]
    problems = [f"{name}: unknown key {key!r}." for key in sorted(set(entry) - ENTRY_KEYS, key=str)]
    problems += _type_problems(entry)
    for text_key in ("label", "help"):
        if not isinstance(entry.get(text_key, ""), str) or len(entry.get(text_key, "")) > 300:
            problems.append(f"{name}: {text_key} must be text of at most 300 characters.")
    if not isinstance(entry.get("required", False), bool):
        problems.append(f"{name}: required must be true or false.")
    if not problems and "default" in entry:
        try:
            parameter_value_clean(entry, entry["default"])
        except ParameterInvalid as refusal:
            problems.append(f"{name}: the default is not valid: {refusal.message}")
    return problems


def _type_problems(entry: dict) -> list[str]:
    name, kind = entry["name"], entry["type"]
    allowed = {
        "int": {"min", "max"},
        "number": {"min", "max"},
        "string": {"max_length"},
        "enum": {"choices"},
        "bool": set(),
    }[kind]
    problems = [
        f"{name}: {key} does not apply to {kind}."
        for key in ("min", "max", "max_length", "choices")
        if key in entry and key not in allowed
    ]
    if kind in ("int", "number"):
        problems += _range_problems(entry)
    if "max_length" in entry and not (
        isinstance(entry["max_length"], int)
        and not isinstance(entry["max_length"], bool)
        and 1 <= entry["max_length"] <= MAX_STRING_LENGTH
    ):
        problems.append(f"{name}: max_length must be a whole number from 1 to {MAX_STRING_LENGTH}.")
    if kind == "enum":
        choices = entry.get("choices")
        if not (
            isinstance(choices, list)
            and choices
            and len(choices) <= MAX_KEYS
            and all(isinstance(choice, str) and 0 < len(choice) <= 100 for choice in choices)
            and len(set(choices)) == len(choices)
        ):
            problems.append(f"{name}: choices must be a list of 1 to {MAX_KEYS} distinct texts.")
    return problems


def _range_problems(entry: dict) -> list[str]:
    name, whole = entry["name"], entry["type"] == "int"
    bounds = {key: entry[key] for key in ("min", "max") if key in entry}
    for key, bound in bounds.items():
        if not _is_number(bound) or (whole and not isinstance(bound, int)) or abs(bound) > MAX_MAGNITUDE:
            return [f"{name}: {key} must be a {'whole ' if whole else ''}number within ±2^53."]
    if len(bounds) == 2 and bounds["min"] > bounds["max"]:
        return [f"{name}: min is above max."]
    return []


def parameters_in_words(schema: list[dict], values: dict[str, Any]) -> list[tuple[str, str]]:
    """An order's parameters as a person reads them, in the schema's order: (label, value) with the label the order
    form shows and yes/no for booleans ("Start Jupyter: yes", not "jupyter=True"); keys the schema no longer names
    keep their name."""
    labels = {entry["name"]: entry.get("label") or entry["name"].replace("_", " ").capitalize() for entry in schema}
    order = {name: position for position, name in enumerate(labels)}
    shown = sorted(values.items(), key=lambda item: order.get(item[0], len(order)))
    return [(labels.get(name, name.replace("_", " ").capitalize()), _value_in_words(value)) for name, value in shown]


def _value_in_words(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
