"""Every write to a resource request: submission with quota admission, approval outcomes, cancellation.

State changes go through `_transition`, which calls the django-fsm transition, saves, and appends the
timeline event in the caller's transaction. Follow-up work is started after commit.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_fsm import TransitionNotAllowed
from django_q.tasks import async_task

from config.errors import Conflict, DomainError, NotPermitted
from config.jsonvalues import as_stored
from config.sql import reserve_id, update_from_values
from requests import approvals, hooks
from requests.choices import ApprovalSubject, EventCode, IfUnplaceable, OverQuota, RequestState
from requests.models import Approval, RequestEvent, ResourceRequest
from requests.models.request import snapshot_hash
from requests.notifications import announce_events
from requests.order_caps import check_order_caps
from requests.orders import (
    Order,
    approval_facts,
    describe_order,
    order_duration_limits,
    order_fingerprint,
    size_order,
    validate_order,
)
from requests.priorities import priority_entitlement, priority_reason, refuse_priority
from requests.quota import (
    Demand,
    DimensionImpact,
    QuotaScope,
    beyond_limits,
    exceeded,
    lock_quota_scope,
    quota_impact,
    quota_scopes,
    request_quota_impact,
)
from requests.reservations import Window, check_capacity, earliest_window, window_impacts
from requests.signals import request_preempted, request_queued, request_releasing
from requests.timeline import Timeline, write_events
from tenancy.choices import ProjectPermission
from tenancy.models import User
from tenancy.selectors import user_has_project_permission


class QuotaExceeded(Conflict):
    code = "quota_exceeded"


class IdempotencyKeyReused(DomainError):
    """An idempotency key sent again with another order than the one it first came with."""

    code = "idempotency_key_reused"


class Unplaceable(DomainError):
    """No node of the inventory could ever hold the order (the order asked to be refused then)."""

    code = "no_matching_spec"


def _transition(
    request: ResourceRequest,
    name: str,
    *,
    actor: User | None,
    code: str,
    message: str,
    data: dict | None = None,
    intervention: bool = False,
) -> ResourceRequest:
    timeline = Timeline(request)
    timeline.move(name, actor=actor, code=code, message=message, data=data, intervention=intervention)
    request.save()
    timeline.write()
    return request


def record_event(
    *,
    request: ResourceRequest,
    actor: User | None,
    code: str,
    message: str,
    data: dict | None = None,
    from_state: str | None = None,
    intervention: bool = False,
) -> RequestEvent:
    """Append to the timeline; without from_state it is a note that leaves the state as it is. `intervention`
    marks a manual operator action (the zero-touch KPI counts them)."""
    timeline = Timeline(request)
    timeline.note(actor=actor, code=code, message=message, data=data, from_state=from_state, intervention=intervention)
    return timeline.write()[0]


def is_operator_intervention(actor: User | None, request: ResourceRequest) -> bool:
    """An operator acting on someone else's request (not the requester, not through an approval)."""
    return bool(
        actor is not None
        and actor.is_authenticated
        and actor.pk != request.requester_id
        and actor.has_perm("requests.change_resourcerequest")
    )


# --- Transitions driven by provisioning ---------------------------------------------------------------------
# Each later stage's move has its own service, which picks the transition and the event code; the caller
# only tells what happened (its message and the run's data). A batch of runs starts and activates its requests
# together, on rows the caller has locked (it read their state to decide); the other moves lock the row here.


def requests_start_provisioning(*, started: list[tuple[ResourceRequest, str, dict]]) -> None:
    """allocated -> provisioning for the requests a batch of provisioning runs took (request, message, run data),
    each row locked by the caller, which read it in this state."""
    _bulk_transition(
        started,
        transition="start_provisioning",
        sources=[RequestState.ALLOCATED],
        code=EventCode.PROVISIONING,
        refusal="Some requests left allocated while their provisioning started.",
    )


def requests_activate(*, activated: list[tuple[ResourceRequest, dict, str, dict]]) -> None:
    """provisioning -> active: provisioning delivered each request (request, delivered: node, host, access; message,
    run data) and it is in use from now; each row locked by the caller, which read it in this state."""
    _bulk_transition(
        [(request, message, {**data, "delivered": delivered}) for request, delivered, message, data in activated],
        transition="activate",
        sources=[RequestState.PROVISIONING],
        code=EventCode.ACTIVE,
        refusal="Some requests left provisioning while they were being activated.",
    )


@transaction.atomic
def request_fail(*, request: ResourceRequest, failure: dict, message: str, data: dict) -> ResourceRequest:
    """A run failed for good; `failure` is `{step, code, message, attempts, details}`."""
    return _transition(
        _locked(request), "fail", actor=None, code=EventCode.FAILED, message=message, data={**data, "failure": failure}
    )


@transaction.atomic
def request_retry_provisioning(
    *, request: ResourceRequest, actor: User, reason: str, message: str, data: dict
) -> ResourceRequest:
    """An operator retries a failed request's provisioning; always a manual intervention."""
    return _transition(
        _locked(request),
        "retry_provisioning",
        actor=actor,
        code=EventCode.PROVISIONING_RETRIED,
        message=message,
        data={**data, "reason": reason},
        intervention=True,
    )


def _locked(request: ResourceRequest) -> ResourceRequest:
    return ResourceRequest.objects.select_for_update().get(pk=request.pk)


# --- Preview and submission --------------------------------------------------------------------------------


def request_preview(*, order: Order, requester: User, over_quota: str = OverQuota.REJECT) -> dict:
    """Cost, quota impact, priority entitlement and approval route of an order, without storing anything."""
    validate_order(order, requester)
    sizing = size_order(order)
    scopes = quota_scopes(order.project)
    impacts = _quota_impacts(order, sizing, scopes)
    entitlement = priority_entitlement(order, scopes[0].max_priority)
    reasons = exceeded(impacts) + _as_list(priority_reason(order, entitlement))
    exception = bool(reasons) and over_quota == OverQuota.EXCEPTION
    facts = approval_facts(order, sizing, requester, quota_exception=exception)
    limits = order_duration_limits(order)
    return {
        "summary": describe_order(order),
        "duration": {"requested": order.duration_hours, "maximum": min(limits.values()), "limits": limits},
        "cost": {
            "hourly": str(sizing.hourly_cost),
            "duration_hours": order.duration_hours,
            "total": str(sizing.cost_estimate),
            "currency": settings.CATALOG_CURRENCY,
        },
        "demand": {
            key: str(value) if isinstance(value, Decimal) else value for key, value in sizing.demand.__dict__.items()
        },
        "quota": [impact.as_data() for impact in impacts],
        "priority": entitlement,
        "fits_quota": not reasons,
        "quota_reasons": reasons,
        "approval_route": approvals.route_for(facts).as_data(),
        "placement": hooks.ask(hooks.PLACEMENT_ESTIMATE, order, sizing),
        "reservation": _reservation_preview(order, sizing),
    }


def _quota_impacts(order: Order, sizing, scopes: list[QuotaScope]) -> list[DimensionImpact]:
    """The order's impact on its quota: now, or for a reservation in its window."""
    if order.window is None:
        return quota_impact(order.project, sizing.demand, scopes)
    return window_impacts(project=order.project, scopes=scopes, window=order.window, demand=sizing.demand)


def _reservation_preview(order: Order, sizing) -> dict | None:
    """A reservation's window and whether its capacity is free, with the earliest window that fits."""
    if order.window is None:
        return None
    return {
        "window": order.window.as_data(),
        "whole_nodes_on_slurm": True,
        "capacity": earliest_window(order=order, sizing=sizing, window=order.window),
    }


def _as_list(reason: dict | None) -> list[dict]:
    return [] if reason is None else [reason]


def _check_choice(name: str, value: str, choices) -> None:
    if value not in choices.values:
        raise DomainError(f"{name} must be one of {', '.join(choices.values)}.", code=f"invalid_{name}")


@dataclass(frozen=True)
class Written:
    """What a submission wrote about its new request besides the row: the whole timeline so far and the approval
    (None when approved automatically or waiting for quota). Nothing else about it exists yet: allocations, runs,
    deployments and usage come after commit. The answer to the submission is built from this, reading nothing."""

    timeline: list[RequestEvent]
    approval: Approval | None


@transaction.atomic
def request_submit(
    *,
    order: Order,
    requester: User,
    over_quota: str = OverQuota.REJECT,
    if_unplaceable: str = IfUnplaceable.WARN,
    idempotency_key: str = "",
) -> ResourceRequest:
    """Admit an order under the project's (and tenant's) quota lock, then route it for approval. An order no node
    could ever hold is refused or submitted with a warning on its timeline, as `if_unplaceable` says.

    The request is inserted once, in the state it reaches (approved automatically, it takes its id first: its
    frozen snapshot names it), its events in one INSERT after it; it comes back with them as `written`.

    With an idempotency key the requester already submitted, nothing is stored: the request that submission made
    comes back with `resubmitted` set (whatever the catalog or quota say now, as a retry expects), or, when the key
    came with another order then, IdempotencyKeyReused."""
    _check_choice("over_quota", over_quota, OverQuota)
    _check_choice("if_unplaceable", if_unplaceable, IfUnplaceable)
    fingerprint = order_fingerprint(order)
    if idempotency_key and (earlier := _submitted_with_key(requester, idempotency_key)) is not None:
        return _resubmitted(earlier, order, fingerprint)
    validate_order(order, requester)
    if over_quota == OverQuota.EXCEPTION and not order.justification.strip():
        raise DomainError(
            "A quota exception needs a justification.",
            code="justification_required",
            details={"field": "justification"},
        )
    sizing = size_order(order)
    lock_quota_scope(order.project)
    scopes = quota_scopes(order.project)
    priority = _priority_beyond_entitlement(order, over_quota, scopes[0].max_priority)
    never_fits = _never_fits(order, sizing, if_unplaceable)
    if order.window is not None and over_quota == OverQuota.WAIT:
        raise DomainError(
            "A reservation is for its window: it cannot wait for quota. Choose another window or ask for a quota "
            "exception.",
            code="reservation_cannot_wait",
            details={"field": "over_quota"},
        )
    reasons = _admission_reasons(over_quota, _quota_impacts(order, sizing, scopes))
    if order.window is not None:
        check_capacity(order=order, sizing=sizing, window=order.window)
    check_order_caps(
        project=order.project,
        requester=requester,
        waiting=bool(reasons) and over_quota == OverQuota.WAIT,
        overrides=scopes[0].order_caps,
    )
    exception_reasons = reasons + _as_list(priority)
    request = ResourceRequest(
        tenant=order.project.tenant,
        project=order.project,
        requester=requester,
        service=order.service,
        spec=order.spec,
        image=order.image,
        bare_metal_profile=order.bare_metal_profile,
        serving_model=order.serving_model,
        serving_template=order.serving_template,
        duration_hours=order.duration_hours,
        reserved_start=order.start_at,
        priority=order.priority,
        justification=order.justification,
        parameters=order.parameters,
        quota_reasons=exception_reasons,
        quota_exception=bool(exception_reasons) and over_quota == OverQuota.EXCEPTION,
        idempotency_key=idempotency_key,
        order_fingerprint=fingerprint,
        **sizing.request_fields(),
    )
    timeline = Timeline(request)
    timeline.note(
        actor=requester,
        code=EventCode.SUBMITTED,
        from_state="",
        message=f"{requester.display_name} ordered {describe_order(order)}."
        + (f" Warning: {never_fits['message']}" if never_fits else ""),
        data={
            "cost_estimate": str(sizing.cost_estimate),
            "over_quota": over_quota,
            **({"never_fits": never_fits} if never_fits else {}),
        },
    )
    if reasons and over_quota == OverQuota.WAIT:
        timeline.move(
            "wait_for_quota",
            actor=requester,
            code=EventCode.QUOTA_EXCEEDED,
            message=_quota_sentence(reasons) + " Waiting until quota frees up" + _waiting_bound() + ".",
            data={"reasons": reasons},
        )
        request.save()
        approval = None
    else:
        _note_admission(timeline, reasons, priority, actor=requester)
        approval = _route(request, order, timeline, actor=requester)
    request.written = Written(timeline=timeline.write(), approval=approval)
    return request


def _submitted_with_key(requester: User, key: str) -> ResourceRequest | None:
    """The request the requester's submission with this key made, if any. The requester's row is locked first, so
    that two submissions with one key (a double click, a client's retry racing its first try) take turns and the
    second finds the first's request, whichever project either names."""
    list(User.objects.select_for_update().filter(pk=requester.pk).values_list("pk"))
    return ResourceRequest.objects.filter(requester=requester, idempotency_key=key).first()


def _resubmitted(earlier: ResourceRequest, order: Order, fingerprint: str) -> ResourceRequest:
    if earlier.order_fingerprint != fingerprint or earlier.justification != order.justification:
        raise IdempotencyKeyReused(
            f"This submission was sent before with another order, which became request #{earlier.pk}; "
            "a new order needs a new idempotency key.",
            details={"request": earlier.pk},
        )
    earlier.resubmitted = True
    return earlier


def _waiting_bound() -> str:
    hours = settings.ORDER_WAITING_EXPIRY_HOURS
    return f" (cancelled if still waiting after {hours} hours)" if hours else ""


def _note_admission(timeline: Timeline, reasons: list[dict], priority: dict | None, *, actor: User) -> None:
    if reasons:
        timeline.note(
            actor=actor,
            code=EventCode.QUOTA_EXCEPTION,
            data={"reasons": reasons},
            message=_quota_sentence(reasons) + " Quota exception requested.",
        )
    else:
        timeline.note(actor=actor, code=EventCode.ADMITTED, message="Fits the project's quota.")
    if priority is not None:
        timeline.note(
            actor=actor,
            code=EventCode.PRIORITY_EXCEPTION,
            data=priority,
            message=priority["message"] + " Priority exception requested.",
        )


def _priority_beyond_entitlement(order: Order, over_quota: str, max_priority: str) -> dict | None:
    """The reason when the order's priority is above the project's entitlement, or None; refused unless the order
    asks for an exception (waiting for quota would never lift an entitlement)."""
    priority = priority_reason(order, priority_entitlement(order, max_priority))
    if priority is not None and over_quota != OverQuota.EXCEPTION:
        refuse_priority(priority, order)
    return priority


def _never_fits(order: Order, sizing, if_unplaceable: str) -> dict | None:
    """Why no node could ever hold the order, or None; refused here when the order asked for that."""
    never_fits = hooks.ask(hooks.ORDER_NEVER_FITS, order, sizing)
    if never_fits and if_unplaceable == IfUnplaceable.REFUSE:
        raise Unplaceable(never_fits["message"], code=never_fits["code"], details=never_fits["details"])
    return never_fits


def _admission_reasons(over_quota: str, impacts: list[DimensionImpact]) -> list[dict]:
    """What the order exceeds (impacts read under the quota lock). Refused when the requester asked for that, and
    when they asked to wait but the order alone passes a limit (nothing freeing up could ever admit it)."""
    reasons = exceeded(impacts)
    if reasons and over_quota == OverQuota.REJECT:
        raise QuotaExceeded(_quota_sentence(reasons), details={"reasons": reasons})
    hopeless = beyond_limits(impacts) if reasons and over_quota == OverQuota.WAIT else []
    if hopeless:
        raise QuotaExceeded(
            " ".join(reason["message"] for reason in hopeless), code="exceeds_limit", details={"reasons": hopeless}
        )
    return reasons


def _quota_sentence(reasons: list[dict]) -> str:
    return "Over quota: " + " ".join(reason["message"] for reason in reasons)


def _route(request: ResourceRequest, order: Order, timeline: Timeline, *, actor: User | None) -> Approval | None:
    """Approve automatically (and queue) or route for approval, saving the request; its approval, if any."""
    facts = approval_facts(order, size_order(order), request.requester, quota_exception=request.quota_exception)
    route = approvals.route_for(facts)
    if route.automatic:
        timeline.move(
            "approve",
            actor=None,
            code=EventCode.AUTO_APPROVED,
            message=route.explanation,
            data={"route": route.as_data()},
        )
        _freeze_and_queue(request, timeline)
        return None
    timeline.move(
        "route_for_approval",
        actor=actor,
        code=EventCode.ROUTED,
        message=route.in_words(),
        data={"route": route.as_data()},
    )
    request.save()
    return approvals.approval_open(subject=request, facts=facts, route=route)


def order_of(request: ResourceRequest) -> Order:
    return Order(
        service=request.service,
        project=request.project,
        duration_hours=request.duration_hours,
        spec=request.spec,
        image=request.image,
        bare_metal_profile=request.bare_metal_profile,
        serving_model=request.serving_model,
        serving_template=request.serving_template,
        priority=request.priority,
        justification=request.justification,
        parameters=request.parameters,
    )


# --- Approval outcome and the frozen snapshot --------------------------------------------------------------


def approved_snapshot(request: ResourceRequest) -> dict:
    """Everything scheduling and provisioning need, copied so later catalog edits cannot change it."""
    spec, image, profile = request.spec, request.image, request.bare_metal_profile
    return {
        "request": request.pk,
        "tenant": request.tenant_id,
        "project": request.project.slug,
        "service": {"slug": request.service.slug, "kind": request.service.kind},
        "spec": None
        if spec is None
        else {
            "slug": spec.slug,
            "name": spec.name,
            "accelerator_count": spec.accelerator_count,
            "accelerator_models": sorted(model.slug for model in spec.accelerator_models.all()),
            "slice_profile": spec.slice_profile.name if spec.slice_profile else None,
            "cpu_cores": spec.cpu_cores,
            "memory_gb": spec.memory_gb,
            # Cards, CPU and memory above are per node; a multi-node spec runs on `nodes` of them at once.
            "nodes": spec.node_count,
            "topology": {"level": spec.topology_level, "mode": spec.topology_mode},
            "local_disk_gb": spec.local_disk_gb,
            "hourly_price": str(spec.hourly_price),
        },
        "image": None
        if image is None
        else {
            "name": image.name,
            "version": image.version,
            "reference": image.reference,
            "configuration": image.configuration,
        },
        "bare_metal_profile": None
        if profile is None
        else {
            "slug": profile.slug,
            "accelerator_model": profile.accelerator_model.slug,
            "accelerator_count": profile.accelerator_count,
            "os_image": str(profile.os_image),
            "os_image_url": profile.os_image.reference,
            "driver_version": profile.driver_version,
            "monitoring_agent": profile.monitoring_agent,
            "gpu_exporter": profile.gpu_exporter,
            "slurm_membership": profile.slurm_membership,
            "target_cluster": profile.target_cluster,
            "validation_suite": profile.validation_suite,
            "playbooks": profile.playbooks,
            "boot_method": profile.boot_method,
            # A PXE boot loads the image's installer kernel and initrd (Image.configuration["netboot"]).
            "netboot": profile.os_image.configuration.get("netboot", {}),
        },
        "serving": None
        if request.serving_model is None
        else {
            "model": str(request.serving_model),
            "model_name": request.serving_model.name,
            "artifact_uri": request.serving_model.artifact_uri,
            "checksum_sha256": request.serving_model.checksum_sha256,
            "runtime": request.serving_template.runtime,
            "replicas": request.serving_template.replicas,
            "context_length": request.serving_template.context_length,
            "max_tokens": request.serving_template.max_tokens,
        },
        "duration_hours": request.duration_hours,
        "priority": request.priority,
        "parameters": request.parameters,
        "demand": {
            "gpu_equivalents": _as_stored(request, "gpu_equivalents"),
            "accelerator_count": request.accelerator_count,
            "accelerator_memory_gb": request.accelerator_memory_gb,
            "cpu_cores": request.cpu_cores,
            "memory_gb": request.memory_gb,
            "card_hours": _as_stored(request, "card_hours"),
        },
        "cost_estimate": _as_stored(request, "cost_estimate"),
        "quota_exception": request.quota_exception,
        # A reservation's window: the cycle starts it there (scheduling/reservations.py).
        **({} if request.reserved_start is None else {"reservation": _window_of(request).as_data()}),
    }


def _window_of(request: ResourceRequest) -> Window:
    return Window(request.reserved_start, request.duration_hours)


def _as_stored(request: ResourceRequest, field: str) -> str:
    """A decimal as the database keeps it, so a fresh and a reloaded request freeze the same snapshot."""
    places = ResourceRequest._meta.get_field(field).decimal_places
    return str(getattr(request, field).quantize(Decimal(1).scaleb(-places)))


def _freeze_and_queue(request: ResourceRequest, timeline: Timeline) -> None:
    """Freeze the approved snapshot and queue the request (saved; the caller writes the timeline). The snapshot
    names the request's id: a new request takes its id first and is inserted once, frozen and queued."""
    if request._state.adding:
        request.pk = reserve_id(ResourceRequest)
    request.approved_spec = as_stored(approved_snapshot(request))
    request.approved_spec_hash = snapshot_hash(request.approved_spec)
    request.approved_at = timezone.now()
    timeline.move(
        "enqueue",
        actor=None,
        code=EventCode.QUEUED,
        message="Approved spec frozen; waiting for the scheduler.",
        data={"approved_spec_hash": request.approved_spec_hash},
    )
    request.save(force_insert=request._state.adding)
    request_id = request.pk
    transaction.on_commit(lambda: request_queued.send(sender=ResourceRequest, request_id=request_id))


class RequestApprovals:
    """How the approval engine reports back to resource requests."""

    subject = ApprovalSubject.RESOURCE_REQUEST

    def default_route(self, facts: approvals.Facts) -> approvals.DefaultRoute | None:
        """A quota exception (over a limit or over the priority entitlement) is never approved automatically;
        other requests are when no rule matches."""
        if not facts.quota_exception:
            return None
        return approvals.operators_decide("Default: operators decide quota matters", reason="it is a quota exception")

    def on_approved(self, request: ResourceRequest, *, actor: User | None) -> None:
        request = _locked(request)
        timeline = Timeline(request)
        who = actor.display_name if actor else "policy"
        timeline.move("approve", actor=actor, code=EventCode.APPROVED, message=f"Approved by {who}.")
        _freeze_and_queue(request, timeline)
        timeline.write()

    def on_rejected(self, request: ResourceRequest, *, actor: User, comment: str) -> None:
        request = _locked(request)
        _transition(
            request,
            "reject",
            actor=actor,
            code=EventCode.REJECTED,
            message=f"Rejected by {actor.display_name}: {comment}",
            data={"comment": comment},
        )
        _readmit_after_commit(request.project_id)

    def note(self, request: ResourceRequest, *, code: str, message: str, actor: User | None, data: dict) -> None:
        record_event(request=request, actor=actor, code=code, message=message, data=data)


# --- Cancellation and operator rejection -------------------------------------------------------------------


def can_cancel(user: User, request: ResourceRequest) -> bool:
    return (
        user.pk == request.requester_id
        or user.has_perm("requests.change_resourcerequest")
        or user_has_project_permission(user=user, project=request.project, permission=ProjectPermission.MANAGE)
    )


@transaction.atomic
def request_cancel(*, request: ResourceRequest, actor: User, reason: str = "") -> ResourceRequest:
    request = _locked(request)
    if not can_cancel(actor, request):
        raise NotPermitted("Only the requester, the project lead or an operator can cancel this request.")
    _transition(
        request,
        "cancel",
        actor=actor,
        code=EventCode.CANCELLED,
        message=f"Cancelled by {actor.display_name}" + (f": {reason}" if reason else "."),
        data={"reason": reason},
        intervention=is_operator_intervention(actor, request),
    )
    approvals.approval_cancel(subject=request)
    _readmit_after_commit(request.project_id)
    return request


@transaction.atomic
def request_reject_by_operator(*, request: ResourceRequest, actor: User, reason: str) -> ResourceRequest:
    """An operator ends a pending request outside the approver set (e.g. a policy mistake), with a reason."""
    if not actor.has_perm("requests.change_resourcerequest"):
        raise NotPermitted("Only operators can reject a request outside its approval route.")
    if not reason.strip():
        raise DomainError("Give a reason; the requester sees it.", code="reason_required")
    request = _locked(request)
    _transition(
        request,
        "reject",
        actor=actor,
        code=EventCode.REJECTED,
        message=f"Rejected by operator {actor.display_name}: {reason}",
        data={"comment": reason},
        intervention=True,
    )
    approvals.approval_cancel(subject=request)
    _readmit_after_commit(request.project_id)
    return request


# --- Waiting for quota -------------------------------------------------------------------------------------


def _readmit_after_commit(project_id: int) -> None:
    transaction.on_commit(lambda: async_task("requests.tasks.readmit_waiting", project_id))


@transaction.atomic
def request_readmit_waiting(*, project_id: int) -> list[ResourceRequest]:
    """Admit waiting requests first come, first served; stop at the first that still does not fit."""
    waiting = (
        ResourceRequest.objects.filter(project_id=project_id, state=RequestState.WAITING_FOR_QUOTA)
        .select_related("project", "service", "spec", "requester")
        .order_by("created_at", "id")
    )
    first = waiting.first()
    if first is None:
        return []
    lock_quota_scope(first.project)
    admitted = []
    for request in list(waiting):  # read again under the lock: a concurrent run may have admitted some already
        reasons = exceeded(quota_impact(request.project, Demand.of(request)))
        if reasons:
            ResourceRequest.objects.filter(pk=request.pk).update(quota_reasons=reasons)
            break
        request = _locked(request)
        request.quota_reasons = []
        timeline = Timeline(request)
        timeline.note(actor=None, code=EventCode.READMITTED, message="Quota freed up; re-admitted.")
        _route(request, order_of(request), timeline, actor=None)
        timeline.write()
        admitted.append(request)
    return admitted


# A sweep cancels at most this many expired waiting requests per transaction (the next batch follows at once).
WAITING_EXPIRY_BATCH = 200


def requests_expire_waiting() -> int:
    """Cancel requests that waited for quota longer than ORDER_WAITING_EXPIRY_HOURS (0: never), each with the reason
    on its timeline (which mails its requester); how many. Rows another transaction holds are left to the next
    sweep."""
    hours = settings.ORDER_WAITING_EXPIRY_HOURS
    if not hours:
        return 0
    expired = 0
    while batch := _expire_waiting_batch(hours):
        expired += batch
    return expired


@transaction.atomic
def _expire_waiting_batch(hours: int) -> int:
    now = timezone.now()
    due = list(
        ResourceRequest.objects.select_for_update(skip_locked=True)
        .filter(state=RequestState.WAITING_FOR_QUOTA, created_at__lte=now - timedelta(hours=hours))
        .order_by("created_at", "id")[:WAITING_EXPIRY_BATCH]
    )
    for request in due:
        waited = int((now - request.created_at).total_seconds() // 3600)
        _transition(
            request,
            "cancel",
            actor=None,
            code=EventCode.WAITING_EXPIRED,
            message=f"Waited {waited} hours for quota, longer than orders are kept waiting ({hours} hours); "
            "cancelled. Order again once the project has room, or ask for a quota exception.",
            data={"waited_hours": waited, "limit_hours": hours, "reasons": request.quota_reasons},
        )
    return len(due)


# --- Scheduling outcomes (called by the scheduler cycle, in bulk) --------------------------------------------


def _bulk_transition(
    items: list[tuple[ResourceRequest, str, dict]],
    *,
    transition: str,
    sources,
    code: str,
    refusal: str,
    also: Callable[[datetime], dict] = lambda now: {},
) -> None:
    """One transition for many requests: each instance's FSM transition first (an illegal one fails as a single
    transition would), then one UPDATE guarded on the source states and one INSERT of timeline events. The UPDATE
    writes the state, its time and what `also` gives for that time, nothing else (the snapshot stays unread and
    unwritten)."""
    if not items:
        return
    now = timezone.now()
    events = []
    for request, message, data in items:
        before = request.state
        try:
            getattr(request, transition)()
        except TransitionNotAllowed as error:
            raise Conflict(
                f"Request #{request.pk} is {before}; '{transition}' is not possible from there.",
                code="illegal_transition",
                details={"state": before, "action": transition},
            ) from error
        events.append(
            RequestEvent(
                request=request,
                from_state=before,
                to_state=request.state,
                code=code,
                message=message,
                data=data,
                created_at=now,
            )
        )
    target = items[0][0].state
    updated = ResourceRequest.objects.filter(pk__in=[request.pk for request, _, _ in items], state__in=sources).update(
        state=target,  # fsm: the target the transitions above reached, compare-and-set on their sources
        updated_at=now,
        **also(now),
    )
    if updated != len(items):
        raise Conflict(refusal, code="state_changed", details={"expected": len(items), "updated": updated})
    write_events(events)


def requests_allocate(*, placed: list[tuple[ResourceRequest, str, dict]]) -> None:
    """queued -> allocated for the requests a scheduling cycle placed."""
    _bulk_transition(
        placed,
        transition="allocate",
        sources=[RequestState.QUEUED],
        code=EventCode.ALLOCATED,
        refusal="Some requests left the queue while they were being allocated.",
        also=_out_of_the_queue,
    )


def _out_of_the_queue(now) -> dict:
    """A request leaving the queue (allocated) or going back to it (preempted) has no place in it for now."""
    return {"queue_position": None, "queue_reason": {}, "queue_updated_at": now}


PREEMPTABLE_STATES = (RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE)


def requests_preempt(*, preempted: list[tuple[ResourceRequest, int | None, str, dict]]) -> None:
    """allocated/provisioning/active -> queued for the victims of a preemption (request, winner id or None,
    message, data). The scheduler has already returned their devices; it places them again like any queued
    request (the approved snapshot stays the contract)."""
    _bulk_transition(
        [(request, message, data) for request, _winner, message, data in preempted],
        transition="preempt",
        sources=PREEMPTABLE_STATES,
        code=EventCode.PREEMPTED,
        refusal="Some requests stopped running while they were being preempted.",
        also=_out_of_the_queue,
    )
    pairs = [(request.pk, winner) for request, winner, _, _ in preempted]

    def announce():
        for request_id, winner_id in pairs:
            request_preempted.send(sender=ResourceRequest, request_id=request_id, winner_id=winner_id)

    transaction.on_commit(announce)


def requests_note(*, code: str, notes: list[tuple[ResourceRequest, str, dict]]) -> None:
    """Put one note (same code) on many timelines in one INSERT; the states stay as they are."""
    now = timezone.now()
    events = RequestEvent.objects.bulk_create(
        [_note(request, code, message, data, now) for request, message, data in notes]
    )
    announce_events(events)


def _note(request: ResourceRequest, code: str, message: str, data: dict, at) -> RequestEvent:
    """A timeline note: an event that leaves the request in the state it is in."""
    return RequestEvent(
        request=request,
        from_state=request.state,
        to_state=request.state,
        code=code,
        message=message,
        data=data,
        created_at=at,
    )


def requests_note_queue(*, waiting: list[tuple[ResourceRequest, int, dict]], estimates: dict[int, dict]) -> None:
    """Store each queued request's position, reason and expected start (`estimates`, by request id: the cycle's
    forecast, scheduling.engine.forecast); a changed reason code also goes on the timeline.

    Only rows whose position, reason or estimate changed are written, in one UPDATE ... FROM (VALUES ...) statement:
    a cycle over thousands of waiting requests must not cost thousands of queries (or Django's slow CASE form).
    """
    now = timezone.now()
    events, changed = [], []
    for request, position, reason in waiting:
        if request.queue_reason.get("code") != reason["code"]:
            events.append(_note(request, EventCode.QUEUE_REASON, reason["message"], reason, now))
        estimate = estimates.get(request.pk, {})
        if (request.queue_position, request.queue_reason, request.queue_estimate) != (position, reason, estimate):
            changed.append((request.pk, position, json.dumps(reason, default=str), json.dumps(estimate)))
    _write_queue_status(changed, now)
    RequestEvent.objects.bulk_create(events)


def requests_note_replans(*, notes: list[tuple[ResourceRequest, str, str, dict]]) -> None:
    """Timeline notes (request, code, sentence, data) on reservations whose planned nodes failed or came back, from
    scheduling's cycle, in one INSERT; those worth a mail are announced after commit (requests.notifications)."""
    if notes:
        now = timezone.now()
        write_events([_note(request, code, message, data, now) for request, code, message, data in notes])


def _write_queue_status(rows: list[tuple[int, int, str, str]], now) -> None:
    table = ResourceRequest._meta.db_table
    update_from_values(
        table=table,
        columns=[("id", "bigint"), ("position", "integer"), ("reason", "jsonb"), ("estimate", "jsonb")],
        rows=rows,
        set_params=[now],
        set_sql="queue_position = v.position, queue_reason = v.reason, queue_estimate = v.estimate, "
        "queue_updated_at = %s",
    )


def can_release(user: User, request: ResourceRequest) -> bool:
    return can_cancel(user, request)


@transaction.atomic
def request_ask_for_capacity(*, request: ResourceRequest, replicas: int, message: str, data: dict) -> ResourceRequest:
    """An active serving request that holds nothing (scaled to zero) asks for `replicas` again: its quota is checked
    as it stands now (a limit lowered while it slept refuses the wake: 409 `quota_exceeded`, with the dimensions),
    then it goes back to the queue, where the next cycle places it as any queued request and provisioning starts
    it again. Its approved snapshot stays the contract; only `replicas` of its replicas are placed."""
    request = _locked(request)
    lock_quota_scope(request.project)
    over = exceeded(request_quota_impact(request))
    if over:
        raise Conflict(
            "Waking this endpoint would exceed the project's quota: " + "; ".join(reason["message"] for reason in over),
            code="quota_exceeded",
            details={"reasons": over},
        )
    request.serving_replicas = replicas
    request.queue_position, request.queue_reason, request.queue_updated_at = None, {}, timezone.now()
    _transition(request, "ask_for_capacity", actor=None, code=EventCode.SCALING_UP, message=message, data=data)
    request_id = request.pk
    transaction.on_commit(lambda: request_queued.send(sender=ResourceRequest, request_id=request_id))
    return request


@transaction.atomic
def request_release(*, request: ResourceRequest, actor: User | None, reason: str) -> ResourceRequest:
    """Give the resources back (early release, expiry, stale reclamation): releasing now, released once the
    environment is torn down and the devices are freed (request_releasing; provisioning decides how)."""
    request = _locked(request)
    if actor is not None and not can_release(actor, request):
        raise NotPermitted("Only the requester, the project lead or an operator can release this request.")
    who = actor.display_name if actor is not None else "the platform"
    _transition(
        request,
        "start_release",
        actor=actor,
        code=EventCode.RELEASING,
        message=f"Release started by {who}: {reason}",
        data={"reason": reason},
        intervention=is_operator_intervention(actor, request),
    )
    request_id = request.pk
    transaction.on_commit(lambda: request_releasing.send(sender=ResourceRequest, request_id=request_id, reason=reason))
    return request


@transaction.atomic
def request_finish_release(*, request: ResourceRequest, message: str) -> ResourceRequest:
    request = _locked(request)
    _transition(request, "finish_release", actor=None, code=EventCode.RELEASED, message=message)
    _readmit_after_commit(request.project_id)
    return request
