"""Giving resources back: release of an allocation, expiry warnings and expiry, stale allocations."""

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from config.errors import Conflict
from requests.choices import EventCode, RequestState
from requests.models import ResourceRequest
from requests.services import (
    PREEMPTABLE_STATES,
    record_event,
    request_finish_release,
    request_release,
    requests_preempt,
)
from scheduling import hooks
from scheduling.allocations import adjust_device_shares
from scheduling.choices import AllocationState, DeviceHealth
from scheduling.models import Allocation, AllocationDevice, Node


def _unbind_devices(allocation: Allocation) -> None:
    unbind_devices([allocation.pk])


def unbind_devices(allocation_ids: list[int]) -> None:
    """Take the allocations' shares off their devices: one read, one UPDATE, however many allocations."""
    shares = (AllocationDevice.objects.filter(allocation_id__in=allocation_ids).values("device_id")
              .annotate(total=Sum("milli")).values_list("device_id", "total").order_by())
    adjust_device_shares({device_id: -total for device_id, total in shares})


def allocation_release(*, request_id: int, reason: str) -> None:
    """A releasing request: its environment is torn down first when provisioning built one (the teardown frees the
    devices at its end), otherwise the devices are freed now."""
    if hooks.release_teardown is None or not hooks.release_teardown(request_id=request_id, reason=reason):
        allocation_free(request_id=request_id, reason=reason)


@transaction.atomic
def allocation_free(*, request_id: int, reason: str) -> ResourceRequest:
    """Return a releasing request's devices to the pool and finish its release (idempotent)."""
    request = ResourceRequest.objects.select_for_update().get(pk=request_id)
    if request.state != RequestState.RELEASING:
        return request
    allocation_return(request_id=request_id, reason=reason)
    return request_finish_release(request=request, message=f"Devices returned to the pool ({reason}).")


@transaction.atomic
def allocation_return(*, request_id: int, reason: str) -> int:
    """Give the request's active allocations back whatever its state (e.g. the cleanup after a failed
    provisioning); idempotent. Returns how many were released."""
    allocations = list(Allocation.objects.select_for_update().filter(request_id=request_id,
                                                                     state=AllocationState.ACTIVE))
    for allocation in allocations:
        _unbind_devices(allocation)
        allocation.state, allocation.released_at, allocation.release_reason = (
            AllocationState.RELEASED, timezone.now(), reason[:300])
        allocation.save(update_fields=["state", "released_at", "release_reason"])
    return len(allocations)


@transaction.atomic
def allocation_rebind(*, allocation: Allocation) -> Allocation:
    """Bind a released allocation's devices (same shares, same node) to its request again, for an operator's retry
    of a failed provisioning. Refused when the devices, the node or its CPU/memory are no longer free."""
    node = Node.objects.select_for_update().get(pk=allocation.node_id)
    bindings = list(allocation.devices.select_related("device"))
    _check_rebindable(allocation, node, bindings)
    rebound = Allocation.objects.create(
        request_id=allocation.request_id, node=node, cpu_milli=allocation.cpu_milli,
        memory_mib=allocation.memory_mib, priority=allocation.priority, preemptible=allocation.preemptible,
        expires_at=allocation.expires_at)
    AllocationDevice.objects.bulk_create([AllocationDevice(allocation=rebound, device=binding.device,
                                                           milli=binding.milli) for binding in bindings])
    try:
        with transaction.atomic():
            adjust_device_shares({binding.device_id: binding.milli for binding in bindings})
    except IntegrityError as taken:
        raise Conflict("The devices have been given to other work since; the request must be ordered again.",
                       code="capacity_taken", details={"node": node.name}) from taken
    return rebound


def _check_rebindable(allocation: Allocation, node: Node, bindings: list[AllocationDevice]) -> None:
    if allocation.state != AllocationState.RELEASED or allocation.expires_at <= timezone.now():
        raise Conflict("Only a released allocation that has not expired can be bound again.",
                       code="not_rebindable", details={"allocation": allocation.pk, "state": allocation.state})
    if not node.schedulable:
        raise Conflict(f"{node.name} is isolated: {node.cordon_reason} Clear it before retrying.",
                       code="node_isolated", details={"node": node.name, "reason": node.cordon_reason})
    unusable = [binding.device.uuid for binding in bindings
                if binding.device.isolated or binding.device.health == DeviceHealth.UNHEALTHY]
    if unusable:
        raise Conflict("Devices of the allocation are isolated or unhealthy.", code="devices_unusable",
                       details={"devices": unusable})
    used = Allocation.objects.filter(node=node, state=AllocationState.ACTIVE).aggregate(
        cpu=Coalesce(Sum("cpu_milli"), 0), memory=Coalesce(Sum("memory_mib"), 0))
    if used["cpu"] + allocation.cpu_milli > node.cpu_milli or used["memory"] + allocation.memory_mib > node.memory_mib:
        raise Conflict(f"{node.name}'s CPU or memory has been given to other work since.", code="capacity_taken",
                       details={"node": node.name})


def warn_expiring(*, now=None) -> int:
    """Put one warning on the timeline of each allocation that expires within the warning window."""
    now = now or timezone.now()
    window = now + timedelta(hours=settings.EXPIRY_WARNING_HOURS)
    due = Allocation.objects.filter(state=AllocationState.ACTIVE, expires_at__lte=window, expires_at__gt=now,
                                    expiry_warned_at__isnull=True).select_related("request")
    warned = 0
    for allocation in due:
        with transaction.atomic():
            record_event(allocation.request, actor=None, code=EventCode.EXPIRY_WARNING,
                         message=f"Expires at {allocation.expires_at:%Y-%m-%d %H:%M} UTC; release or ask for an "
                                 "extension before then.", data={"expires_at": allocation.expires_at.isoformat()})
            Allocation.objects.filter(pk=allocation.pk).update(expiry_warned_at=now)
            warned += 1
    return warned


def _release_all(allocations, reason: str) -> list[int]:
    released = []
    for allocation in allocations:
        request = allocation.request
        if request.state in (RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE):
            request_release(request=request, actor=None, reason=reason)
            released.append(request.pk)
    return released


def reclaim_expired(*, now=None) -> list[int]:
    now = now or timezone.now()
    expired = Allocation.objects.filter(state=AllocationState.ACTIVE, expires_at__lte=now).select_related("request")
    return _release_all(expired, "expired: the approved duration is over")


def reclaim_stale(*, now=None) -> list[int]:
    """Allocations whose runtime has stopped reporting for longer than the heartbeat timeout."""
    now = now or timezone.now()
    cutoff = now - timedelta(minutes=settings.ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES)
    stale = Allocation.objects.filter(state=AllocationState.ACTIVE, heartbeat_at__isnull=False).filter(
        Q(heartbeat_at__lt=cutoff)).select_related("request")
    return _release_all(stale, f"stale: no heartbeat from the runtime for "
                               f"{settings.ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES} minutes")


@transaction.atomic
def requeue_from_device(*, device_id: int) -> list[int]:
    """Requests running on an isolated device give it back and return to the queue (SCHEDULER_REQUEUE_ON_ISOLATION).

    Their approved snapshot stays the contract; the next cycle places them on healthy hardware.
    """
    allocations = list(Allocation.objects.select_for_update(of=("self",))
                       .filter(state=AllocationState.ACTIVE, request__state__in=PREEMPTABLE_STATES,
                               pk__in=AllocationDevice.objects.filter(device_id=device_id).values("allocation_id"))
                       .select_related("request"))
    if not allocations:
        return []
    now = timezone.now()
    unbind_devices([allocation.pk for allocation in allocations])
    for allocation in allocations:
        allocation.state, allocation.released_at = AllocationState.RELEASED, now
        allocation.release_reason = f"requeued: device #{device_id} was isolated"
    Allocation.objects.bulk_update(allocations, ["state", "released_at", "release_reason"])
    requests_preempt(preempted=[(allocation.request, None, "Requeued: a device of the allocation was isolated; the "
                                 "request waits for healthy hardware.", {"device": device_id})
                                for allocation in allocations])
    return [allocation.request_id for allocation in allocations]


def runtime_report(*, reports: list[tuple[int, str]], now=None) -> dict[int, str]:
    """What the runtime (agents on the nodes) says about requests' workloads: "running" refreshes the heartbeat,
    "gone" reclaims the allocation at once. Returns, per request id, what was done."""
    now = now or timezone.now()
    statuses = dict(reports)
    active = {allocation.request_id: allocation for allocation in Allocation.objects.filter(
        state=AllocationState.ACTIVE, request_id__in=statuses).select_related("request")}
    outcome = {request_id: "no_active_allocation" for request_id in statuses if request_id not in active}
    running = [request_id for request_id, status in statuses.items() if status == "running" and request_id in active]
    Allocation.objects.filter(pk__in=[active[request_id].pk for request_id in running]).update(heartbeat_at=now)
    outcome.update(dict.fromkeys(running, "heartbeat"))
    gone = [active[request_id] for request_id, status in statuses.items() if status == "gone" and request_id in active]
    for request_id in _release_all(gone, "stale: the runtime reports the workload gone"):
        outcome[request_id] = "reclaimed"
    return outcome


def allocation_extend(*, request_id: int, hours: int) -> int:
    """An approved extension moves the active allocation's expiry; a new warning will come before the new end."""
    return Allocation.objects.filter(request_id=request_id, state=AllocationState.ACTIVE).update(
        expires_at=F("expires_at") + timedelta(hours=hours), expiry_warned_at=None)
