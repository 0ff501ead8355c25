"""Every write to scheduling inventory and health: cordons, health, isolation and its four-eyes clearance (the
inventory import is its own module, scheduling/inventory/importer.py).

Each service locks the row it changes, writes one audit row in the same transaction, and refuses with a
DomainError (code, message, details) that leaves the record as it was.
"""

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_q.tasks import async_task

from catalog.runtimes import serving_runtimes_problems
from config.errors import Conflict, DomainError, NotPermitted
from requests import approvals
from requests.choices import ApprovalSubject, ApproverSource, ChangeState, EventCode, RequestState
from requests.services import is_operator_intervention, record_event
from scheduling import selectors
from scheduling.choices import AllocationState, DeviceHealth
from scheduling.models import (
    DEVICE_STATE_FIELDS,
    NODE_STATE_FIELDS,
    AllocationDevice,
    Device,
    HealthRule,
    IsolationClearance,
    Node,
)
from scheduling.signals import node_availability_changed
from tenancy.models import User
from tenancy.services import audit_record, configuration_save

CLEAR_ISOLATION = "scheduling.clear_device_isolation"


def _reason(reason: str | None) -> str:
    text = (reason or "").strip()
    if not text:
        raise DomainError("Give a reason; it goes on the audit record.", code="reason_required")
    return text


def _who(user: User | None) -> str:
    return user.username if user is not None and user.is_authenticated else "the platform"


def _announce_availability(node: Node, *, available: bool) -> None:
    """After the commit, tell the data plane (e.g. Slurm's drain) and the scheduler that the node's availability
    changed; `available` when it may take work it could not take before."""
    node_id, backend = node.pk, node.execution_backend
    transaction.on_commit(
        lambda: node_availability_changed.send(
            sender=Node, node_id=node_id, execution_backend=backend, available=available
        )
    )


# --- Nodes -------------------------------------------------------------------------------------------------


# What a cordon leaves of a request holding devices on the node, by its state: the words follow the state.
_CORDON_LEAVES = {
    RequestState.ALLOCATED: "Setting up your request there goes on",
    RequestState.PROVISIONING: "Setting up your request there goes on",
    RequestState.ACTIVE: "Your workload keeps running there until it is released or expires",
    RequestState.RELEASING: "The release of your workload there goes on",
}


@transaction.atomic
def node_cordon(node: Node, reason: str, actor: User | None) -> Node:
    """Stop new placements on a node; what runs there keeps running."""
    reason = _reason(reason)
    node = Node.objects.select_for_update().get(pk=node.pk)
    if not node.schedulable:
        raise Conflict(
            f"{node.name} is already cordoned: {node.cordon_reason}",
            code="already_cordoned",
            details={"node": node.name, "cordon_reason": node.cordon_reason},
        )
    node.schedulable, node.cordon_reason, node.cordoned_at = False, reason, timezone.now()
    node.cordoned_by = actor if actor is not None and actor.is_authenticated else None
    node.save(update_fields=["schedulable", "cordon_reason", "cordoned_at", "cordoned_by", "updated_at"])
    audit_record(actor=actor, action="node.cordoned", target=node, reason=reason)
    for running in selectors.running_requests_on(node_ids=[node.pk]):
        what_goes_on = _CORDON_LEAVES.get(running["request"].state)
        if what_goes_on is None:  # failed or ended: its devices are on their way back, there is nothing to tell
            continue
        record_event(
            running["request"],
            actor=actor,
            code=EventCode.NODE_CORDONED,
            message=f"Node {node.name} was cordoned by {_who(actor)}: {reason}. {what_goes_on}; new placements avoid "
            "the node."
            + (
                f" Replica(s) {', '.join(map(str, running['replicas']))} there leave the endpoint's rotation while "
                "replicas on other nodes serve."
                if running["replicas"]
                else ""
            ),
            data={"node": node.name, "reason": reason},
        )
    _announce_availability(node, available=False)
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
    audit_record(actor=actor, action="node.uncordoned", target=node, reason=reason, data={"cordon_reason": previous})
    _announce_availability(node, available=True)
    return node


@transaction.atomic
def node_serving_runtimes_report(
    *, nodes, runtimes: dict[str, list[str]], probed: frozenset[str], actor: User | None = None
) -> list[Node]:
    """What a host found it can serve for these nodes: for each runtime it `probed`, the model files it holds
    (`runtimes`; a probed runtime missing from it is not installed). Runtimes it did not probe stay as configured.
    The nodes whose runtimes changed, each with an audit row."""
    problems = serving_runtimes_problems(runtimes)
    if problems:
        raise DomainError(" ".join(problems), code="invalid_serving_runtimes", details={"runtimes": runtimes})
    changed = []
    for node in Node.objects.select_for_update().filter(pk__in=[node.pk for node in nodes]).order_by("pk"):
        before = dict(node.serving_runtimes)
        after = {runtime: files for runtime, files in before.items() if runtime not in probed}
        after.update({runtime: sorted(files) for runtime, files in runtimes.items() if runtime in probed})
        if after == before:
            continue
        node.serving_runtimes = after
        node.save(update_fields=["serving_runtimes", "updated_at"])
        audit_record(
            actor=actor, action="node.serving_runtimes_reported", target=node, data={"before": before, "after": after}
        )
        changed.append(node)
    return changed


@transaction.atomic
def inventory_entry_save(entry, changed_fields: list[str], actor: User | None):
    """Save a site, rack, node, device, health or preemption rule edited by an operator, with an audit row.
    Cordons, health, isolation, allocated shares and MIG modes are not editable this way (the admin shows them
    read-only)."""
    protected = {*NODE_STATE_FIELDS, *DEVICE_STATE_FIELDS} & set(changed_fields)
    if protected:
        raise DomainError(
            f"{', '.join(sorted(protected))} change only through cordon, health, isolation and MIG mode actions "
            "(and node reports).",
            code="protected_field",
            details={"fields": sorted(protected)},
        )
    return configuration_save(entry=entry, changed_fields=changed_fields, actor=actor)


# --- Devices -----------------------------------------------------------------------------------------------


def _locked_device(device: Device) -> Device:
    return Device.objects.select_for_update(of=("self",)).select_related("node", "model").get(pk=device.pk)


@transaction.atomic
def device_set_health(
    device: Device,
    health: str,
    detail: str,
    actor: User | None = None,
    *,
    degraded_by: HealthRule | None = None,
    data: dict | None = None,
) -> Device:
    """Record the health a signal reports; a repeat of the current health changes nothing (no audit row).

    A degraded card remembers the rule that degraded it (`degraded_by`), whose recovery settings later return it
    to healthy; any change restarts its recovery clock. `data` adds the reason's numbers to the audit row.
    """
    if health not in DeviceHealth.values:
        raise DomainError(
            f"Health must be one of {', '.join(DeviceHealth.values)}.",
            code="invalid_health",
            details={"health": health},
        )
    device = _locked_device(device)
    if device.health == health:
        return device
    previous = device.health
    device.health, device.health_detail = health, (detail or "")[:300]
    device.degraded_by = degraded_by if health == DeviceHealth.DEGRADED else None
    device.clear_since = None
    device.save(update_fields=["health", "health_detail", "degraded_by", "clear_since", "updated_at"])
    audit_record(
        actor=actor,
        action="device.health_changed",
        target=device,
        reason=detail or "",
        data={"from": previous, "to": health, **(data or {})},
    )
    return device


@transaction.atomic
def device_mark_healthy(device: Device, reason: str, actor: User | None) -> Device:
    """An operator's word that a degraded card is fine again (e.g. after a cooling fix), with a reason.

    Only degraded cards: an isolated one is cleared by two people (`isolation_clearance_request`), never here.
    """
    reason = _reason(reason)
    device = _locked_device(device)
    if device.isolated:
        raise Conflict(
            f"{device} is isolated; clearing an isolation needs a second operator's approval (request an "
            "isolation clearance).",
            code="device_isolated",
            details={"device": device.uuid, "isolation_reason": device.isolation_reason},
        )
    if device.health != DeviceHealth.DEGRADED:
        raise Conflict(
            f"{device} is {device.get_health_display().lower()}, not degraded.",
            code="device_not_degraded",
            details={"device": device.uuid, "health": device.health},
        )
    rule = device.degraded_by.name if device.degraded_by_id else None
    return device_set_health(
        device,
        DeviceHealth.HEALTHY,
        f"Marked healthy by {_who(actor)}: {reason}",
        actor,
        data={"code": "marked_healthy", "reason": reason, "degraded_by": rule, "health_detail": device.health_detail},
    )


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
    device.clear_since = None  # a degraded card's recovery starts over once two people have cleared the isolation
    device.save(update_fields=["isolated", "isolation_reason", "isolated_at", "clear_since", "updated_at"])
    holders = list(
        AllocationDevice.objects.filter(device=device, allocation__state=AllocationState.ACTIVE).select_related(
            "allocation__request"
        )
    )
    spared = set(
        selectors.replicas_serving_without(device_id=device.pk)
        .filter(request_id__in=[binding.allocation.request_id for binding in holders])
        .values_list("request_id", flat=True)
    )
    requeue = settings.SCHEDULER_REQUEUE_ON_ISOLATION and any(
        binding.allocation.request_id not in spared for binding in holders
    )
    affected = []
    for binding in holders:
        request = binding.allocation.request
        affected.append(request.pk)
        if request.pk in spared:
            consequence = (
                f"Replica {binding.allocation.replica} leaves the rotation; the deployment's other replicas keep "
                "serving."
            )
        elif settings.SCHEDULER_REQUEUE_ON_ISOLATION:
            consequence = "Your request goes back to the queue for healthy hardware."
        else:
            consequence = "Your allocation still holds it; new placements avoid it."
        record_event(
            request,
            actor=actor,
            code=EventCode.DEVICE_ISOLATED,
            message=f"Device {device.node.name}/gpu{device.index} ({device.uuid}) was isolated by "
            f"{_who(actor)}: {reason}. {consequence}",
            data={
                "device": device.uuid,
                "node": device.node.name,
                "index": device.index,
                "allocation": binding.allocation_id,
                "reason": reason,
            },
            intervention=is_operator_intervention(actor, request),
        )
    audit_record(
        actor=actor,
        action="device.isolated",
        target=device,
        reason=reason,
        data={"node": device.node.name, "index": device.index, "uuid": device.uuid, "affected_requests": affected},
    )
    _announce_availability(device.node, available=False)
    device_id = device.pk
    transaction.on_commit(lambda: async_task("scheduling.tasks.notify_isolation", device_id, affected, requeue))
    if requeue:
        transaction.on_commit(lambda: async_task("scheduling.tasks.requeue_from_device", device_id))
    return device


# --- Isolation clearance (four eyes) -----------------------------------------------------------------------


@transaction.atomic
def isolation_clearance_request(device: Device, reason: str, actor: User) -> IsolationClearance:
    """Ask to clear a device's isolation; another holder of the dedicated permission must approve it."""
    if not actor.has_perm(CLEAR_ISOLATION):
        raise NotPermitted(
            f"Clearing a device's isolation needs the dedicated permission {CLEAR_ISOLATION}.",
            code="missing_permission",
            details={"permission": CLEAR_ISOLATION},
        )
    reason = _reason(reason)
    device = _locked_device(device)
    if not device.isolated:
        raise Conflict(f"{device} is not isolated.", code="device_not_isolated", details={"device": device.uuid})
    pending = IsolationClearance.objects.filter(device=device, state=ChangeState.PENDING_APPROVAL).first()
    if pending is not None:
        raise Conflict(
            f"A clearance of {device} is already waiting for approval.",
            code="clearance_pending",
            details={"clearance": pending.pk, "requested_by": pending.requested_by.username},
        )
    try:
        with transaction.atomic():
            clearance = IsolationClearance.objects.create(device=device, requested_by=actor, reason=reason)
    except IntegrityError as race:
        raise Conflict(f"A clearance of {device} is already waiting for approval.", code="clearance_pending") from race
    audit_record(
        actor=actor,
        action="isolation_clearance.requested",
        target=clearance,
        reason=reason,
        data={"device": device.uuid, "isolation_reason": device.isolation_reason},
    )
    facts = approvals.Facts(
        subject=ApprovalSubject.ISOLATION_CLEARANCE,
        project=None,
        requester=actor,
        summary=f"Clear isolation of {device}: {reason}",
        vendor_ids=frozenset({device.model.vendor_id}),
        accelerator_model_ids=frozenset({device.model_id}),
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
            name="Default: another holder of the clearance permission decides",
            stage="Clearance approvers",
            approvers=approvals.permission_holders(CLEAR_ISOLATION),
            source=ApproverSource.USERS,
            note=f"Holders of {CLEAR_ISOLATION} other than the requester.",
        )

    def on_approved(self, clearance: IsolationClearance, *, actor: User | None) -> None:
        clearance = IsolationClearance.objects.select_for_update().select_related("requested_by").get(pk=clearance.pk)
        if actor is None or not actor.has_perm(CLEAR_ISOLATION):
            raise NotPermitted(
                f"Approving a clearance needs {CLEAR_ISOLATION}.",
                code="missing_permission",
                details={"permission": CLEAR_ISOLATION},
            )
        if actor.pk == clearance.requested_by_id:
            raise NotPermitted("You cannot approve your own clearance.", code="self_approval")
        device = _locked_device(clearance.device)
        previous = device.isolation_reason
        device.isolated, device.isolation_reason, device.isolated_at = False, "", None
        device.save(update_fields=["isolated", "isolation_reason", "isolated_at", "updated_at"])
        clearance.decide(approved=True)
        clearance.approved_by = actor
        clearance.save(update_fields=["state", "approved_by", "decided_at"])
        requester = clearance.requested_by.username
        audit_record(
            actor=actor,
            action="device.isolation_cleared",
            target=device,
            reason=f"{clearance.reason} (requested by {requester}, approved by {actor.username})",
            data={
                "clearance": clearance.pk,
                "requested_by": requester,
                "approved_by": actor.username,
                "isolation_reason": previous,
                "health": device.health,
            },
        )
        _announce_availability(device.node, available=True)

    def on_rejected(self, clearance: IsolationClearance, *, actor: User, comment: str) -> None:
        clearance = IsolationClearance.objects.select_for_update().get(pk=clearance.pk)
        clearance.decide(approved=False)
        clearance.save(update_fields=["state", "decided_at"])
        audit_record(actor=actor, action="isolation_clearance.rejected", target=clearance, reason=comment)

    def note(self, clearance: IsolationClearance, *, code: str, message: str, actor: User | None, data: dict) -> None:
        audit_record(actor=actor, action=f"isolation_clearance.{code}", target=clearance, reason=message, data=data)
