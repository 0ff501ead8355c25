"""Hooks higher apps register in their ready(), so request pages and the API can show their data without importing
them (see docs/architecture.md, "Layering").

Each hook is a `typing.Protocol` named once here, with the app that provides it. `register` checks an
implementation against the protocol's call signature; `get` is the typed accessor. The `requests.E001` system
check (requests/checks.py) fails at start-up when an installed provider did not register its hook, so a renamed or
forgotten registration is an error instead of a page that silently shows less.
"""

import inspect
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypedDict, TypeVar

Implementation = TypeVar("Implementation")


@dataclass(frozen=True)
class Hook(Generic[Implementation]):
    name: str
    protocol: type[Implementation]
    provider: str  # label of the app whose ready() registers it


class AllocationDetails(Protocol):
    """scheduling: the request's allocation (node, devices, expiry) as a dict, or None."""

    def __call__(self, resource_request: Any, /) -> dict | None: ...


class PlacementEstimate(Protocol):
    """scheduling: would an order fit now ({fits_now, node, queued_ahead, code, message}), given (order, sizing)."""

    def __call__(self, order: Any, sizing: Any, /) -> dict | None: ...


class OrderNeverFits(Protocol):
    """scheduling: why no node of the inventory could ever hold an order ({code, message, details}), or None;
    given (order, sizing). Submission refuses or warns on it."""

    def __call__(self, order: Any, sizing: Any, /) -> dict | None: ...


class ProvisioningDetails(Protocol):
    """provisioning: the request's provisioning runs with their steps, and what was delivered ({runs, delivered})."""

    def __call__(self, resource_request: Any, /) -> dict | None: ...


class EndpointDetails(Protocol):
    """provisioning: a model-serving request's endpoint (URL, replicas and their health, tokens this month, the
    project's API keys), or None."""

    def __call__(self, resource_request: Any, /) -> dict | None: ...


class RightsizingAdvice(Protocol):
    """metering: rightsizing advice for (user, project, spec or None), as a list of dicts with a "message"."""

    def __call__(self, user: Any, project: Any, spec: Any, /) -> list[dict]: ...


class RequestUsage(TypedDict):
    card_hours: Any  # Decimal
    energy_kwh: float
    cost: Any  # Decimal
    currency: str


class RequestUsageProvider(Protocol):
    """metering: what a request has used so far (card-hours, energy, cost), all its allocations together; None
    while it never held an allocation."""

    def __call__(self, resource_request: Any, /) -> RequestUsage | None: ...


ALLOCATION_DETAILS = Hook("allocation_details", AllocationDetails, provider="scheduling")
PLACEMENT_ESTIMATE = Hook("placement_estimate", PlacementEstimate, provider="scheduling")
ORDER_NEVER_FITS = Hook("order_never_fits", OrderNeverFits, provider="scheduling")
PROVISIONING_DETAILS = Hook("provisioning_details", ProvisioningDetails, provider="provisioning")
ENDPOINT_DETAILS = Hook("endpoint_details", EndpointDetails, provider="provisioning")
RIGHTSIZING_ADVICE = Hook("rightsizing_advice", RightsizingAdvice, provider="metering")
REQUEST_USAGE = Hook("request_usage", RequestUsageProvider, provider="metering")

HOOKS = (
    ALLOCATION_DETAILS,
    PLACEMENT_ESTIMATE,
    ORDER_NEVER_FITS,
    PROVISIONING_DETAILS,
    ENDPOINT_DETAILS,
    RIGHTSIZING_ADVICE,
    REQUEST_USAGE,
)

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
