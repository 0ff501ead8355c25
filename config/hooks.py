"""The cross-app hook registry: a lower app names a hook (a `typing.Protocol` in its own hooks.py, with the app that
provides it); the higher app registers an implementation in its ready(); callers `ask` it.

`register` checks an implementation against the protocol's call signature. The `requests.E001` system check
(requests/checks.py) fails at start-up when an installed provider did not register a declared hook, so a renamed
or forgotten registration is an error instead of a page that silently shows less.
"""

import inspect
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Implementation = TypeVar("Implementation")

# Every hook declared, in declaration order: what the system check walks.
DECLARED: list["Hook"] = []


@dataclass(frozen=True)
class Hook(Generic[Implementation]):
    name: str
    protocol: type[Implementation]
    provider: str  # label of the app whose ready() registers it

    def __post_init__(self):
        DECLARED.append(self)


_registered: dict[str, Any] = {}


def register(hook: Hook[Implementation], implementation: Implementation) -> None:
    """Fill in `hook`; refuses (TypeError) an implementation that cannot be called the way the protocol is."""
    expected = [
        parameter
        for parameter in inspect.signature(hook.protocol.__call__).parameters.values()
        if parameter.name != "self"
    ]
    try:
        inspect.signature(implementation).bind(*expected)
    except (TypeError, ValueError) as error:
        accepted = ", ".join(parameter.name for parameter in expected)
        raise TypeError(f"{implementation!r} cannot serve the {hook.name} hook: it must accept ({accepted})") from error
    _registered[hook.name] = implementation


def get(hook: Hook[Implementation]) -> Implementation | None:
    """The registered implementation, or None while its provider app is not installed."""
    return _registered.get(hook.name)


def ask(hook: Hook, *arguments) -> Any:
    """The hook's answer for `arguments`, or None while its provider app is not installed."""
    implementation = get(hook)
    return None if implementation is None else implementation(*arguments)
