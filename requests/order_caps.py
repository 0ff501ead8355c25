"""Caps on a project's orders, so that one account (or one project) cannot flood the queue: open orders and orders
waiting for quota, per requester and per project (tenancy.choices.OrderCap; defaults ORDER_MAX_*, per-project
overrides on the project's quota). Checked at submission under the project's quota lock, so concurrent orders
cannot pass a cap together."""

from django.conf import settings
from django.db.models import Count, FilteredRelation, Q

from config.errors import Conflict
from requests.choices import OPEN_STATES, RequestState
from tenancy.choices import OrderCap
from tenancy.models import Project, User


class OrderCapReached(Conflict):
    code = "order_cap_reached"


def _caps_and_counts(project: Project, requester: User) -> tuple[dict[str, int], dict[str, int]]:
    """The caps in force for the project (0: none; each the project's own, else the platform's default) and how many
    orders each counts now: one statement, over the project's open requests only."""
    waiting, mine = Q(open__state=RequestState.WAITING_FOR_QUOTA), Q(open__requester=requester)
    row = (
        Project.objects.filter(pk=project.pk)
        .annotate(open=FilteredRelation("requests", condition=Q(requests__state__in=sorted(OPEN_STATES))))
        .values(*(f"quota__{cap.field}" for cap in OrderCap))
        .annotate(
            **{
                f"count_{OrderCap.OPEN_PER_PROJECT}": Count("open"),
                f"count_{OrderCap.OPEN_PER_REQUESTER}": Count("open", filter=mine),
                f"count_{OrderCap.WAITING_PER_PROJECT}": Count("open", filter=waiting),
                f"count_{OrderCap.WAITING_PER_REQUESTER}": Count("open", filter=waiting & mine),
            }
        )
        .get()
    )
    caps = {cap.value: row[f"quota__{cap.field}"] for cap in OrderCap}
    caps = {cap: own if own is not None else getattr(settings, OrderCap(cap).setting) for cap, own in caps.items()}
    return caps, {cap.value: row[f"count_{cap.value}"] for cap in OrderCap}


_SENTENCES = {
    OrderCap.OPEN_PER_REQUESTER: "You have {current} open orders in {project}, the most one person may have",
    OrderCap.OPEN_PER_PROJECT: "{project} has {current} open orders, the most a project may have",
    OrderCap.WAITING_PER_REQUESTER: "You have {current} orders waiting for quota in {project}, the most one person "
    "may have waiting",
    OrderCap.WAITING_PER_PROJECT: "{project} has {current} orders waiting for quota, the most a project may have "
    "waiting",
}


def check_order_caps(*, project: Project, requester: User, waiting: bool) -> None:
    """Refuse (409 order_cap_reached, naming the cap) an order that would pass one of the project's caps: the open
    caps for every order, the waiting caps also when it would wait for quota. Call under the quota lock."""
    checked = [OrderCap.OPEN_PER_REQUESTER, OrderCap.OPEN_PER_PROJECT]
    if waiting:
        checked += [OrderCap.WAITING_PER_REQUESTER, OrderCap.WAITING_PER_PROJECT]
    caps, counts = _caps_and_counts(project, requester)
    for cap in checked:
        limit, current = caps[cap], counts[cap]
        if limit and current >= limit:
            raise OrderCapReached(
                _SENTENCES[cap].format(current=current, project=project.name)
                + " (cap: "
                + OrderCap(cap).label.lower()
                + "). Cancel or finish one first, or ask an operator to raise the cap.",
                details={"cap": cap, "limit": limit, "current": current, "project": project.slug},
            )
