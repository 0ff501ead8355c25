"""Extending a running request: more hours, checked against the monthly card-hour budget and approved by the
same rules as a new order. The approved snapshot stays as it was; the request's duration and committed
card-hours grow, and with the duration the allocation's end (derived from it, so the extension writes the request
alone)."""

from dataclasses import replace

from django.db import transaction

from config.errors import Conflict, DomainError, NotPermitted
from requests import approvals
from requests.choices import ApprovalSubject, ChangeState, EventCode, RequestState
from requests.models import RequestExtension, ResourceRequest
from requests.orders import OrderInvalid, approval_facts, order_duration_limits, size_order
from requests.quota import Demand, exceeded, lock_quota_scope, quota_impact
from requests.services import QuotaExceeded, can_release, order_of, record_event
from requests.signals import request_extended
from tenancy.models import User

EXTENDABLE = (RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE)


@transaction.atomic
def request_extension_submit(
    *, request: ResourceRequest, hours: int, justification: str, actor: User
) -> RequestExtension:
    request = (
        ResourceRequest.objects.select_for_update(of=("self",))
        .select_related("service", "spec", "project")
        .get(pk=request.pk)
    )
    if not can_release(actor, request):
        raise NotPermitted("Only the requester, the project lead or an operator can extend this request.")
    if request.state not in EXTENDABLE:
        raise Conflict(
            f"Request #{request.pk} is {request.get_state_display().lower()}; only running requests can be extended.",
            code="not_running",
            details={"state": request.state},
        )
    if not justification.strip():
        raise DomainError("Say why it needs more time.", code="justification_required")
    maximum = min(order_duration_limits(order_of(request)).values())
    if hours < 1 or request.duration_hours + hours > maximum:
        raise OrderInvalid(
            f"The whole duration must stay within {maximum} hours (now {request.duration_hours}).",
            code="duration_out_of_range",
            details={"requested": hours, "maximum": maximum, "current": request.duration_hours},
        )
    if request.extensions.filter(state=ChangeState.PENDING_APPROVAL).exists():
        raise Conflict("An extension of this request is already waiting for approval.", code="extension_pending")
    extra = Demand(
        gpus=0,
        accelerator_memory_gb=0,
        cpu_cores=0,
        memory_gb=0,
        concurrent_tasks=0,
        monthly_card_hours=request.gpu_equivalents * hours,
    )
    lock_quota_scope(request.project)
    reasons = exceeded(quota_impact(request.project, extra))
    if reasons:
        raise QuotaExceeded(
            "Over quota: " + " ".join(reason["message"] for reason in reasons), details={"reasons": reasons}
        )
    extension = RequestExtension.objects.create(
        request=request, requested_by=actor, hours=hours, justification=justification.strip()
    )
    record_event(
        request=request,
        actor=actor,
        code=EventCode.EXTENSION_REQUESTED,
        data={"hours": hours},
        message=f"{actor.display_name} asked for {hours} more hours: {extension.justification}",
    )
    order = replace(order_of(request), duration_hours=hours)
    facts = approval_facts(order, size_order(order), actor, quota_exception=False)
    facts = replace(facts, summary=f"Extension of #{request.pk} by {hours} h: {facts.summary}")
    approval, _route = approvals.approval_start(subject=extension, facts=facts)
    if approval is None:
        ExtensionApprovals().on_approved(extension, actor=None)
    return extension


class ExtensionApprovals:
    """How the approval engine reports back to extensions (routed like resource requests)."""

    subject = ApprovalSubject.RESOURCE_REQUEST

    def on_approved(self, extension: RequestExtension, *, actor: User | None) -> None:
        extension = RequestExtension.objects.select_for_update().get(pk=extension.pk)
        request = ResourceRequest.objects.select_for_update().get(pk=extension.request_id)
        extension.decide(approved=True)
        extension.save()
        request.duration_hours += extension.hours
        request.card_hours += request.gpu_equivalents * extension.hours
        request.cost_estimate += request.hourly_cost * extension.hours
        request.save(update_fields=["duration_hours", "card_hours", "cost_estimate", "updated_at"])
        who = actor.display_name if actor else "policy"
        record_event(
            request=request,
            actor=actor,
            code=EventCode.EXTENDED,
            data={"hours": extension.hours},
            message=f"Extended by {extension.hours} hours (approved by {who}); now {request.duration_hours} "
            "hours in all.",
        )
        request_id, extension_id, duration_hours = request.pk, extension.pk, request.duration_hours
        transaction.on_commit(
            lambda: request_extended.send(
                sender=ResourceRequest,
                request_id=request_id,
                extension_id=extension_id,
                duration_hours=duration_hours,
            )
        )

    def on_rejected(self, extension: RequestExtension, *, actor: User, comment: str) -> None:
        extension = RequestExtension.objects.select_for_update().get(pk=extension.pk)
        extension.decide(approved=False)
        extension.save()
        record_event(
            request=extension.request,
            actor=actor,
            code=EventCode.EXTENSION_REJECTED,
            data={"comment": comment},
            message=f"Extension by {extension.hours} hours rejected by {actor.display_name}: {comment}",
        )

    def note(self, extension: RequestExtension, *, code: str, message: str, actor: User | None, data: dict) -> None:
        record_event(request=extension.request, actor=actor, code=code, message=message, data=data)
