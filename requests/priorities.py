"""A project's priority entitlement: the highest class it may order without approval, kept on its quota.

An order above the entitlement is refused (`priority_not_permitted`, naming the allowed classes) unless the
requester asks for an exception (over_quota=exception, with a justification). Then the reason joins the quota
reasons and the request is a quota exception: the same route as an order over a limit, never approved
automatically (see `RequestApprovals.default_route`).
"""

from config.words import listed
from requests.orders import Order, OrderInvalid
from tenancy.choices import PRIORITY_RANK, PriorityClass, priorities_up_to

PRIORITY_NOT_PERMITTED = "priority_not_permitted"


def priority_entitlement(order: Order, max_priority: str) -> dict:
    """What the preview shows: the requested class, the project's entitlement (`max_priority`, read with its quota
    limits, never from a cached `project.quota`: an operator may just have changed it), the classes allowed
    without approval."""
    return {
        "requested": str(order.priority),
        "max_priority": max_priority,
        "allowed": priorities_up_to(max_priority),
        "permitted": PRIORITY_RANK[order.priority] <= PRIORITY_RANK[max_priority],
    }


def priority_reason(order: Order, entitlement: dict) -> dict | None:
    """The order's priority as a quota reason when it is above the project's entitlement, else None."""
    if entitlement["permitted"]:
        return None
    allowed = entitlement["allowed"]
    return {
        "code": PRIORITY_NOT_PERMITTED,
        "scope": "project",
        "dimension": "priority",
        "requested": str(order.priority),
        "used": None,
        "limit": entitlement["max_priority"],
        "allowed": allowed,
        "message": f"Priority {PriorityClass(order.priority).label} is above what project {order.project} may order "
        f"without approval ({listed([PriorityClass(code).label for code in allowed])}).",
    }


def refuse_priority(reason: dict, order: Order) -> None:
    raise OrderInvalid(
        reason["message"] + " Ask for a quota exception, with a justification, to have it approved.",
        code=PRIORITY_NOT_PERMITTED,
        details={
            "field": "priority",
            "requested": reason["requested"],
            "max_priority": reason["limit"],
            "allowed": reason["allowed"],
            "project": order.project.slug,
        },
    )
