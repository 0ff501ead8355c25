"""What the order page offers after the service refused an order: the way forward, as links people can follow.

The refusal itself (code, message, details) is the service's; this module only turns its numbers into next steps:
a quota change request the lead finds filled in, the same order again as a quota exception, or the order with the
spec that rightsizing advises. Codes stay in the API and in data attributes; people read the links' words.
"""

from decimal import Decimal
from urllib.parse import urlencode

from django.urls import reverse

from config.errors import DomainError
from requests.choices import OverQuota
from requests.orders import describe_order
from requests.priorities import PRIORITY_NOT_PERMITTED
from tenancy.choices import ProjectPermission
from tenancy.selectors import user_has_project_permission

# Refusals a quota exception (approved by the exception route) can lift.
EXCEPTION_CODES = frozenset({"quota_exceeded", PRIORITY_NOT_PERMITTED})
QUOTA_CODES = frozenset({"quota_exceeded", "exceeds_limit"})


def next_steps(refusal: DomainError, *, form, user, rightsizing: list[dict]) -> list[dict]:
    """Each step as {kind, label, url}; `form` is the order form that was refused (valid, so it has an order)."""
    order = form.order()
    steps = []
    if refusal.code in QUOTA_CODES:
        steps.append(_quota_change_step(refusal, order, user))
    if refusal.code in EXCEPTION_CODES and form.cleaned_data["over_quota"] != OverQuota.EXCEPTION:
        steps.append(
            {
                "kind": "exception",
                "label": "Ask for a quota exception instead (add a justification, then submit)",
                "url": order_url(form, over_quota=OverQuota.EXCEPTION),
            }
        )
    steps += rightsized_steps(form, rightsizing)
    return steps


def _quota_change_step(refusal: DomainError, order, user) -> dict:
    """The lead gets the quota change page with the limits this order needs; anyone else is told whom to ask."""
    project = order.project
    if not user_has_project_permission(user=user, project=project, permission=ProjectPermission.MANAGE):
        return {
            "kind": "quota_change",
            "label": f"Ask {project.lead.get_full_name() or project.lead.username}, the lead of {project}, "
            "for a larger quota",
            "url": None,
        }
    needed = {  # the project's limits this order needs (a tenant's limits are the operators' to change)
        reason["dimension"]: Decimal(reason["used"]) + Decimal(reason["requested"])
        for reason in refusal.details.get("reasons", [])
        if reason.get("scope") == "project" and reason.get("used") is not None
    }
    query = {dimension: f"{limit.normalize():f}" for dimension, limit in needed.items()}
    query["justification"] = f"Room for {describe_order(order)}."
    return {
        "kind": "quota_change",
        "label": "Ask for a larger quota (the form is filled in with what this order needs)",
        "url": f"{reverse('portal:project-quota', args=[project.pk])}?{urlencode(query)}",
    }


def rightsized_steps(form, rightsizing: list[dict]) -> list[dict]:
    """The same order with each spec rightsizing suggests instead, where the service offers it."""
    if "spec" not in form.fields:
        return []
    slugs = [suggestion["spec"] for advice in rightsizing for suggestion in advice.get("suggestions", [])]
    offered = {spec.slug: spec for spec in form.fields["spec"].queryset.filter(slug__in=slugs)} if slugs else {}
    return [
        {
            "kind": "rightsized",
            "label": f"Use the rightsized spec: {offered[slug].name}",
            "url": order_url(form, spec=offered[slug].pk),
        }
        for slug in dict.fromkeys(slugs)
        if slug in offered
    ]


def order_url(form, **overrides) -> str:
    """The order page with the form's values (and the overrides) in the query string: the same order, changed."""
    return f"{reverse('portal:order', args=[form.service.slug])}?{urlencode({**form.as_data(), **overrides})}"
