"""Hooks higher apps fill in their ready(), so request pages and the API can show their data without importing
them (see docs/architecture.md, "Layering")."""

from collections.abc import Callable
from typing import Any, Protocol, TypedDict

# scheduling: the request's allocation (node, devices, expiry) as a dict, or None.
allocation_details: Callable[[Any], dict | None] | None = None

# scheduling: would an order fit now ({fits_now, node, queued_ahead, code, message}), given (order, sizing).
placement_estimate: Callable[[Any, Any], dict | None] | None = None

# scheduling: why no node of the inventory could ever hold an order ({code, message, details}), or None; given
# (order, sizing). Submission refuses or warns on it.
order_never_fits: Callable[[Any, Any], dict | None] | None = None

# provisioning: the request's provisioning runs with their steps, and what was delivered ({runs, delivered}), or None.
provisioning_details: Callable[[Any], dict | None] | None = None

# provisioning: a model-serving request's endpoint (URL, replicas and their health, tokens this month, the
# project's API keys), or None.
endpoint_details: Callable[[Any], dict | None] | None = None

# metering: the card-hours already metered for a request, as a query expression over ResourceRequest rows
# (OuterRef("pk") is the request), so admission counts only the unmetered remainder of running work.
metered_card_hours: Callable[[], Any] | None = None

# metering: rightsizing advice for (user, project, spec or None), as a list of dicts with a "message".
rightsizing_advice: Callable[[Any, Any, Any], list[dict]] | None = None


class RequestUsage(TypedDict):
    card_hours: Any  # Decimal
    energy_kwh: float
    cost: Any  # Decimal
    currency: str


class RequestUsageProvider(Protocol):
    """metering: what a request has used so far (card-hours, energy, cost), all its allocations together; None
    while it never held an allocation."""

    def __call__(self, resource_request: Any) -> RequestUsage | None: ...


request_usage: RequestUsageProvider | None = None
