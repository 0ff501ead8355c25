"""Requests in any state, reached by walking legal transitions (the state field is protected)."""

from requests.choices import RequestState as S
from requests.models import ResourceRequest
from requests.orders import Order, size_order

_TO_QUEUED = ["route_for_approval", "approve", "enqueue"]
_TO_ALLOCATED = [*_TO_QUEUED, "allocate"]
_TO_ACTIVE = [*_TO_ALLOCATED, "start_provisioning", "activate"]

PATHS = {
    S.SUBMITTED: [],
    S.WAITING_FOR_QUOTA: ["wait_for_quota"],
    S.PENDING_APPROVAL: ["route_for_approval"],
    S.APPROVED: ["route_for_approval", "approve"],
    S.QUEUED: _TO_QUEUED,
    S.ALLOCATED: _TO_ALLOCATED,
    S.PROVISIONING: [*_TO_ALLOCATED, "start_provisioning"],
    S.ACTIVE: _TO_ACTIVE,
    S.RELEASING: [*_TO_ACTIVE, "start_release"],
    S.RELEASED: [*_TO_ACTIVE, "start_release", "finish_release"],
    S.REJECTED: ["route_for_approval", "reject"],
    S.CANCELLED: ["cancel"],
    S.FAILED: [*_TO_ALLOCATED, "fail"],
}


def walk(request: ResourceRequest, state: str) -> ResourceRequest:
    for name in PATHS[state]:
        getattr(request, name)()
    assert request.state == state
    return request


def stored_request(order: Order, requester, state: str) -> ResourceRequest:
    """A saved request for the order, in the given state (no approval, no snapshot, no timeline)."""
    request = ResourceRequest.objects.create(
        tenant_id=order.project.tenant_id,
        project=order.project,
        requester=requester,
        service=order.service,
        spec=order.spec,
        image=order.image,
        duration_hours=order.duration_hours,
        **size_order(order).request_fields(),
    )
    walk(request, state)
    request.save()
    return request
