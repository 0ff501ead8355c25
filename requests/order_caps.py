"""Caps on a project's orders, so that one account (or one project) cannot flood the queue: open orders and orders
waiting for quota, per requester and per project (tenancy.choices.OrderCap; defaults ORDER_MAX_*, per-project
overrides on the project's quota, read with its limits by requests.quota). Checked at submission under the project's
quota lock, so concurrent orders cannot pass a cap together."""

from django.conf import settings
from django.db import connection

from config.errors import Conflict
from requests.choices import OPEN_STATES, RequestState
from requests.models import ResourceRequest
from tenancy.choices import OrderCap
from tenancy.models import Project, User


class OrderCapReached(Conflict):
    code = "order_cap_reached"


def caps_in_force(overrides: dict) -> dict[str, int]:
    """Each cap (0: none): the project's own where it has one, else the platform's default."""
    return {
        cap.value: own if (own := overrides.get(cap.value)) is not None else getattr(settings, cap.setting)
        for cap in OrderCap
    }


def _counts(project: Project, requester: User, limits: dict[str, int]) -> dict[str, int]:
    """How many orders each cap counts now, each counted no further than its limit (reaching it is all a check
    needs to know, and a big project's thousands of orders are never all read): one statement."""
    open_orders = ResourceRequest.objects.filter(project=project, state__in=sorted(OPEN_STATES)).order_by()
    counted = {
        OrderCap.OPEN_PER_PROJECT: open_orders,
        OrderCap.OPEN_PER_REQUESTER: open_orders.filter(requester=requester),
        OrderCap.WAITING_PER_PROJECT: open_orders.filter(state=RequestState.WAITING_FOR_QUOTA),
        OrderCap.WAITING_PER_REQUESTER: open_orders.filter(state=RequestState.WAITING_FOR_QUOTA, requester=requester),
    }
    parts, params = [], []
    for cap, limit in limits.items():
        sql, cap_params = counted[cap].values("pk")[:limit].query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS {cap})")
        params.extend(cap_params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        return dict(zip(limits, cursor.fetchone(), strict=True))


_SENTENCES = {
    OrderCap.OPEN_PER_REQUESTER: "You have {current} open orders in {project}, the most one person may have",
    OrderCap.OPEN_PER_PROJECT: "{project} has {current} open orders, the most a project may have",
    OrderCap.WAITING_PER_REQUESTER: "You have {current} orders waiting for quota in {project}, the most one person "
    "may have waiting",
    OrderCap.WAITING_PER_PROJECT: "{project} has {current} orders waiting for quota, the most a project may have "
    "waiting",
}


def check_order_caps(*, project: Project, requester: User, waiting: bool, overrides: dict) -> None:
    """Refuse (409 order_cap_reached, naming the cap) an order that would pass one of the project's caps: the open
    caps for every order, the waiting caps also when it would wait for quota. `overrides` are the project's own caps
    (requests.quota.QuotaScope.order_caps). Call under the quota lock; reads nothing when no cap applies."""
    caps = caps_in_force(overrides)
    checked = [OrderCap.OPEN_PER_REQUESTER, OrderCap.OPEN_PER_PROJECT]
    if waiting:
        checked += [OrderCap.WAITING_PER_REQUESTER, OrderCap.WAITING_PER_PROJECT]
    limits = {cap.value: caps[cap] for cap in checked if caps[cap]}
    if not limits:
        return
    for cap, current in _counts(project, requester, limits).items():
        if current >= limits[cap]:
            raise OrderCapReached(
                _SENTENCES[cap].format(current=current, project=project.name)
                + f" (cap: {OrderCap(cap).label.lower()}). Cancel or finish one first, or ask an operator to raise "
                "the cap.",
                details={"cap": cap, "limit": limits[cap], "current": current, "project": project.slug},
            )
