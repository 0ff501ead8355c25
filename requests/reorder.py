"""Order again: what a request was ordered with, as the order form's link (prefilled, previewed on load) and as the
body `POST /api/v1/requests/` takes, so a failed or finished request is never a dead end."""

from urllib.parse import urlencode

from django.urls import reverse

from requests.choices import TERMINAL_STATES, RequestState
from requests.models import ResourceRequest
from tenancy.choices import ProjectPermission
from tenancy.selectors import user_has_project_permission

ORDER_AGAIN_STATES = TERMINAL_STATES | {RequestState.FAILED}
OFFERINGS = ("spec", "image", "bare_metal_profile", "serving_model", "serving_template")


def may_order_again(user, request: ResourceRequest) -> bool:
    return request.state in ORDER_AGAIN_STATES and user_has_project_permission(
        user=user, project=request.project, permission=ProjectPermission.REQUEST
    )


def submit_body(request: ResourceRequest) -> dict:
    """The API's submit body for the same order."""
    body = {"service": request.service_id, "project": request.project_id}
    body.update({name: getattr(request, f"{name}_id") for name in OFFERINGS if getattr(request, f"{name}_id")})
    return {
        **body,
        "duration_hours": request.duration_hours,
        "priority": request.priority,
        "justification": request.justification,
        "parameters": request.parameters,
    }


def form_link(request: ResourceRequest) -> str:
    """The order form with the same choices, duration, priority, justification and parameters filled in (a
    serving order's spec is its template's, so the template names it)."""
    body = submit_body(request)
    offerings = {name: body[name] for name in OFFERINGS if name in body}
    if "serving_template" in offerings:
        offerings.pop("spec", None)
    query = {
        "project": request.project_id,
        **offerings,
        "duration_hours": request.duration_hours,
        "priority": request.priority,
        **({"justification": request.justification} if request.justification else {}),
        **{name: _as_field(value) for name, value in request.parameters.items() if value not in (None, "")},
    }
    return f"{reverse('portal:order', args=[request.service.slug])}?{urlencode(query)}"


def _as_field(value) -> str:
    """A parameter as its form field reads it back (a checkbox takes "on"; false is left unticked)."""
    if isinstance(value, bool):
        return "on" if value else ""
    return str(value)
