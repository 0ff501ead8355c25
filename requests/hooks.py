"""Hooks higher apps register in their ready(), so request pages and the API can show their data without importing
them (see docs/architecture.md, "Layering"; the registry itself is config/hooks.py).
"""

from typing import Any, Protocol, TypedDict

from config.hooks import Hook, ask, get, register

__all__ = ["Hook", "ask", "get", "register"]


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


class OrdersNeverFit(Protocol):
    """scheduling: ORDER_NEVER_FITS for a list of (order, sizing) pairs, one answer per pair, over one load of the
    inventory (the catalog marks every option it lists)."""

    def __call__(self, orders: list[tuple[Any, Any]], /) -> list[dict | None]: ...


class StartsIfApproved(Protocol):
    """scheduling: the expected start of each request awaiting approval if all were approved now, as
    {request id: estimate data} (requests/start_words.py says them), for a list of request ids in one forecast."""

    def __call__(self, request_ids: list[int], /) -> dict[int, dict]: ...


class HeldEnds(Protocol):
    """scheduling: when the work holding devices for the given projects ends, as {request id: approved end (None: no
    end)}; reservation admission counts what still runs at a window's start."""

    def __call__(self, project_ids: list[int], /) -> dict[int, Any]: ...


class EarliestWindow(Protocol):
    """scheduling: the earliest start at or after `start` at which the order's window of `hours` fits the capacity
    (running work ending at its approved end, other reservations held), as {start (ISO or None), fits_asked, code,
    message}; given (order, sizing, start, hours)."""

    def __call__(self, order: Any, sizing: Any, start: Any, hours: int, /) -> dict | None: ...


class ProvisioningDetails(Protocol):
    """provisioning: the request's provisioning runs with their steps, and what was delivered ({runs, delivered})."""

    def __call__(self, resource_request: Any, /) -> dict | None: ...


class ConnectSecrets(Protocol):
    """provisioning: the secrets that open an active request's workload (a workspace's Jupyter token) as
    {name: {label, secret, access, rotated_at}}, for its requester (`viewer`) only; None for anyone else."""

    def __call__(self, resource_request: Any, viewer: Any, /) -> dict | None: ...


class EndpointDetails(Protocol):
    """serving: a model-serving request's endpoint (URL, replicas and their health, tokens this month, the
    project's API keys), or None. The URL starts with `base_url` (the address the caller reached us by), else
    with PUBLIC_BASE_URL."""

    def __call__(self, resource_request: Any, base_url: str | None = None, /) -> dict | None: ...


class RightsizingAdvice(Protocol):
    """metering: rightsizing advice for (user, project or None, spec or None), as a list of dicts with "project" and
    "spec" (slugs) and a "message"; no project means every project the user sees."""

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


class IdleStatus(Protocol):
    """metering: where an active request stands with its offering's idle policy, for `viewer` ({idle_for, acts_at,
    stoppable, snoozes_left, can_snooze, reasons, snoozed_until}), or None while it is not warned."""

    def __call__(self, resource_request: Any, viewer: Any, /) -> dict | None: ...


ALLOCATION_DETAILS = Hook("allocation_details", AllocationDetails, provider="scheduling")
PLACEMENT_ESTIMATE = Hook("placement_estimate", PlacementEstimate, provider="scheduling")
ORDER_NEVER_FITS = Hook("order_never_fits", OrderNeverFits, provider="scheduling")
ORDERS_NEVER_FIT = Hook("orders_never_fit", OrdersNeverFit, provider="scheduling")
STARTS_IF_APPROVED = Hook("starts_if_approved", StartsIfApproved, provider="scheduling")
HELD_ENDS = Hook("held_ends", HeldEnds, provider="scheduling")
EARLIEST_WINDOW = Hook("earliest_window", EarliestWindow, provider="scheduling")
PROVISIONING_DETAILS = Hook("provisioning_details", ProvisioningDetails, provider="provisioning")
ENDPOINT_DETAILS = Hook("endpoint_details", EndpointDetails, provider="serving")
CONNECT_SECRETS = Hook("connect_secrets", ConnectSecrets, provider="provisioning")
RIGHTSIZING_ADVICE = Hook("rightsizing_advice", RightsizingAdvice, provider="metering")
REQUEST_USAGE = Hook("request_usage", RequestUsageProvider, provider="metering")
IDLE_STATUS = Hook("idle_status", IdleStatus, provider="metering")
