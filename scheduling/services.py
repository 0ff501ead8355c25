"""Every write to scheduling inventory and health: cordons, health, isolation and its four-eyes clearance, imports.

Each service locks the row it changes, writes one audit row in the same transaction, and refuses with a
DomainError (code, message, details) that leaves the record as it was.
"""

from django.db import IntegrityError, transaction
from django.utils import timezone

from config.errors import Conflict, DomainError, NotPermitted
from requests import approvals
from requests.choices import ApprovalSubject, ApproverSource, EventCode
from requests.services import record_event
from scheduling.choices import AllocationState, DeviceHealth
from scheduling.models import AllocationDevice, Device, IsolationClearance, Node
from tenancy.models import User
from tenancy.services import audit_record

CLEAR_ISOLATION = "scheduling.clear_device_isolation"


def _reason(reason: str | None) -> str:
    text = (reason or "").strip()
    if not text:
        raise DomainError("Give a reason; it goes on the audit record.", code="reason_required")
    return text


def _who(user: User | None) -> str:
    return user.username if user is not None and user.is_authenticated else "the platform"


# --- Nodes -------------------------------------------------------------------------------------------------

@transaction.atomic
def node_cordon(node: Node, reason: str, actor: User | None) -> Node:
    """Stop new placements on a node; what runs there keeps running."""
    reason = _reason(reason)
    node = Node.objects.select_for_update().get(pk=node.pk)
    if not node.schedulable:
        raise Conflict(f"{node.name} is already cordoned: {node.cordon_reason}", code="already_cordoned",
                       details={"node": node.name, "cordon_reason": node.cordon_reason})
    node.schedulable, node.cordon_reason, node.cordoned_at = False, reason, timezone.now()
    node.cordoned_by = actor if actor is not None and actor.is_authenticated else None
    node.save(update_fields=["schedulable", "cordon_reason", "cordoned_at", "cordoned_by", "updated_at"])
    audit_record(actor=actor, action="node.cordoned", target=node, reason=reason)
    return node


@transaction.atomic
def node_uncordon(node: Node, reason: str, actor: User | None) -> Node:
    """Let the scheduler place on the node again."""
    reason = _reason(reason)
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.schedulable:
        raise Conflict(f"{node.name} is not cordoned.", code="not_cordoned", details={"node": node.name})
    previous = node.cordon_reason
    node.schedulable, node.cordon_reason, node.cordoned_at, node.cordoned_by = True, "", None, None
    node.save(update_fields=["schedulable", "cordon_reason", "cordoned_at", "cordoned_by", "updated_at"])
    audit_record(actor=actor, action="node.uncordoned", target=node, reason=reason,
                 data={"cordon_reason": previous})
    return node


# --- Devices -----------------------------------------------------------------------------------------------

def _locked_device(device: Device) -> Device:
    return Device.objects.select_for_update(of=("self",)).select_related("node", "model").get(pk=device.pk)


@transaction.atomic
def device_set_health(device: Device, health: str, detail: str, actor: User | None = None) -> Device:
    """Record the health a signal reports; a repeat of the current health changes nothing (no audit row)."""
    if health not in DeviceHealth.values:
        raise DomainError(f"Health must be one of {', '.join(DeviceHealth.values)}.", code="invalid_health",
                          details={"health": health})
    device = _locked_device(device)
    if device.health == health:
        return device
    previous = device.health
    device.health, device.health_detail = health, (detail or "")[:300]
    device.save(update_fields=["health", "health_detail", "updated_at"])
    audit_record(actor=actor, action="device.health_changed", target=device, reason=detail or "",
                 data={"from": previous, "to": health})
    return device


@transaction.atomic
def device_isolate(device: Device, reason: str, actor: User | None = None) -> Device:
    """No new placements on the device. Requests holding it now hear about it on their timeline.

    Isolating an isolated device changes nothing (health signals repeat); clearing needs four eyes
    (`isolation_clearance_request`).
    """
    reason = _reason(reason)
    device = _locked_device(device)
    if device.isolated:
        return device
    device.isolated, device.isolation_reason, device.isolated_at = True, reason, timezone.now()
    device.save(update_fields=["isolated", "isolation_reason", "isolated_at", "updated_at"])
    holders = (AllocationDevice.objects.filter(device=device, allocation__state=AllocationState.ACTIVE)
               .select_related("allocation__request"))
    affected = []
    for binding in holders:
        request = binding.allocation.request
        affected.append(request.pk)
        record_event(request, actor=actor, code=EventCode.DEVICE_ISOLATED,
                     message=f"Device {device.node.name}/gpu{device.index} ({device.uuid}) was isolated by "
                             f"{_who(actor)}: {reason}. Your allocation still holds it; new placements avoid it.",
                     data={"device": device.uuid, "node": device.node.name, "index": device.index,
                           "allocation": binding.allocation_id, "reason": reason})
    audit_record(actor=actor, action="device.isolated", target=device, reason=reason,
                 data={"node": device.node.name, "index": device.index, "uuid": device.uuid,
                       "affected_requests": affected})
    return device


# --- Isolation clearance (four eyes) -----------------------------------------------------------------------

@transaction.atomic
def isolation_clearance_request(device: Device, reason: str, actor: User) -> IsolationClearance:
    """Ask to clear a device's isolation; another holder of the dedicated permission must approve it."""
    if not actor.has_perm(CLEAR_ISOLATION):
        raise NotPermitted("Clearing a device's isolation needs the dedicated permission "
                           f"{CLEAR_ISOLATION}.", code="missing_permission", details={"permission": CLEAR_ISOLATION})
    reason = _reason(reason)
    device = _locked_device(device)
    if not device.isolated:
        raise Conflict(f"{device} is not isolated.", code="device_not_isolated", details={"device": device.uuid})
    pending = IsolationClearance.objects.filter(device=device, state=IsolationClearance.State.PENDING).first()
    if pending is not None:
        raise Conflict(f"A clearance of {device} is already waiting for approval.", code="clearance_pending",
                       details={"clearance": pending.pk, "requested_by": pending.requested_by.username})
    try:
        with transaction.atomic():
            clearance = IsolationClearance.objects.create(device=device, requested_by=actor, reason=reason)
    except IntegrityError as race:
        raise Conflict(f"A clearance of {device} is already waiting for approval.",
                       code="clearance_pending") from race
    audit_record(actor=actor, action="isolation_clearance.requested", target=clearance, reason=reason,
                 data={"device": device.uuid, "isolation_reason": device.isolation_reason})
    facts = approvals.Facts(
        subject=ApprovalSubject.ISOLATION_CLEARANCE, project=None, requester=actor,
        summary=f"Clear isolation of {device}: {reason}",
        vendor_ids=frozenset({device.model.vendor_id}), accelerator_model_ids=frozenset({device.model_id}),
        accelerator_count=1,
        parameters={"device": device.uuid, "node": device.node.name, "health": device.health},
    )
    approval, _route = approvals.approval_start(subject=clearance, facts=facts)
    if approval is None:  # the default route makes this impossible; never clear without a second person
        raise DomainError("An isolation clearance cannot be approved automatically.", code="route_automatic")
    return clearance


class IsolationClearanceApprovals:
    """How the approval engine reports back to isolation clearances."""

    subject = ApprovalSubject.ISOLATION_CLEARANCE

    def default_route(self, facts: approvals.Facts) -> approvals.DefaultRoute:
        """Never automatic; unless a policy names approvers, the other holders of the permission decide."""
        return approvals.DefaultRoute(
            name="Default: another holder of the clearance permission decides", stage="Clearance approvers",
            approvers=approvals.permission_holders(CLEAR_ISOLATION), source=ApproverSource.USERS,
            note=f"Holders of {CLEAR_ISOLATION} other than the requester.")

    def on_approved(self, clearance: IsolationClearance, *, actor: User | None) -> None:
        clearance = IsolationClearance.objects.select_for_update().select_related("requested_by").get(pk=clearance.pk)
        if actor is None or not actor.has_perm(CLEAR_ISOLATION):
            raise NotPermitted(f"Approving a clearance needs {CLEAR_ISOLATION}.", code="missing_permission",
                               details={"permission": CLEAR_ISOLATION})
        if actor.pk == clearance.requested_by_id:
            raise NotPermitted("You cannot approve your own clearance.", code="self_approval")
        device = _locked_device(clearance.device)
        previous = device.isolation_reason
        device.isolated, device.isolation_reason, device.isolated_at = False, "", None
        device.save(update_fields=["isolated", "isolation_reason", "isolated_at", "updated_at"])
        clearance.state, clearance.approved_by, clearance.decided_at = (
            IsolationClearance.State.APPLIED, actor, timezone.now())
        clearance.save(update_fields=["state", "approved_by", "decided_at"])
        requester = clearance.requested_by.username
        audit_record(actor=actor, action="device.isolation_cleared", target=device,
                     reason=f"{clearance.reason} (requested by {requester}, approved by {actor.username})",
                     data={"clearance": clearance.pk, "requested_by": requester, "approved_by": actor.username,
                           "isolation_reason": previous, "health": device.health})

    def on_rejected(self, clearance: IsolationClearance, *, actor: User, comment: str) -> None:
        clearance = IsolationClearance.objects.select_for_update().get(pk=clearance.pk)
        clearance.state, clearance.decided_at = IsolationClearance.State.REJECTED, timezone.now()
        clearance.save(update_fields=["state", "decided_at"])
        audit_record(actor=actor, action="isolation_clearance.rejected", target=clearance, reason=comment)

    def note(self, clearance: IsolationClearance, *, code: str, message: str, actor: User | None,
             data: dict) -> None:
        audit_record(actor=actor, action=f"isolation_clearance.{code}", target=clearance, reason=message, data=data)
