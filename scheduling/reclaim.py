"""Giving resources back: release of an allocation, expiry warnings and expiry, stale allocations.

Reclaim batches (expiry, staleness, the runtime's reports) decide item by item, each in its own transaction on
rows locked with SKIP LOCKED: the batch's first read only names candidates, the decision is taken on the locked
row, and a row another transaction holds (a user's release, a provisioning step) is reported `busy` and looked
at again on the next pass, so one race never stops the rest of the batch. Outcomes per item: `released`,
`already_releasing` (released or being released by someone else), `not_found` (no allocation (still) due),
`busy`, plus `heartbeat` and `not_your_node` for runtime reports.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, Exists, ExpressionWrapper, F, Min, OuterRef, Q, Sum, Value
from django.db.models.functions import Coalesce, Least
from django.db.models.lookups import GreaterThan, LessThanOrEqual
from django.utils import timezone
from django_fsm import TransitionNotAllowed
from django_q.tasks import async_task

from config.errors import Conflict
from requests.choices import ChangeState, EventCode, RequestState
from requests.models import RequestExtension, ResourceRequest
from requests.services import (
    PREEMPTABLE_STATES,
    record_event,
    request_finish_release,
    request_release,
    requests_preempt,
)
from scheduling.allocations import adjust_device_shares
from scheduling.choices import AllocationState, DeviceHealth
from scheduling.inventory.agents import ANY_NODE, NOT_YOUR_NODE, NodeScope
from scheduling.mig import cycle as mig_cycle
from scheduling.mig import services as mig_services
from scheduling.models import ENDS_AT, Allocation, AllocationDevice, Hours, Minutes, Node
from scheduling.selectors import replicas_serving_without
from scheduling.signals import allocation_ended
from scheduling.task_names import CYCLE_TASK


def _unbind_devices(allocation_ids: list[int]) -> list[int]:
    """Take the allocations' shares off their devices: one read, one UPDATE, however many allocations. Returns the
    devices."""
    shares = dict(
        AllocationDevice.objects.filter(allocation_id__in=allocation_ids)
        .values("device_id")
        .annotate(total=Sum("milli"))
        .values_list("device_id", "total")
        .order_by()
    )
    adjust_device_shares({device_id: -total for device_id, total in shares.items()})
    return list(shares)


Reason = str | Callable[[Allocation], str]  # one sentence for all, or one per allocation (whom a preemption serves)


def allocation_release(*, allocations: list[Allocation], reason: Reason) -> None:
    """active -> released for allocations the caller has locked: every transition first (an illegal one refuses
    before anything is written), then the devices' shares back and the allocations saved, and a card drained for a
    mode switch switched once its last work is gone, in a fixed number of statements however many there are."""
    now = timezone.now()
    for allocation in allocations:
        try:
            allocation.release(reason=reason if isinstance(reason, str) else reason(allocation), at=now)
        except TransitionNotAllowed as error:
            raise Conflict(
                f"Allocation #{allocation.pk} is {allocation.state}; it cannot be released again.",
                code="illegal_transition",
                details={"allocation": allocation.pk, "state": allocation.state, "action": "release"},
            ) from error
    devices = _unbind_devices([allocation.pk for allocation in allocations])
    mig_cycle.release_instances([allocation.pk for allocation in allocations])
    Allocation.objects.bulk_update(allocations, ["state", "released_at", "release_reason"])
    mig_services.mode_switches_after_drain(device_ids=devices)


@transaction.atomic
def allocation_free(
    *, request_ids: list[int], reason: Reason, allocation_ids: Iterable[int] | None = None
) -> list[Allocation]:
    """The end of every release pipeline (release, expiry, staleness, preemption, isolation requeue, the cleanup
    after a failure): the requests' active allocations (or only `allocation_ids` of them: a scale to zero frees those
    whose server stopped) go back to the pool, and a releasing request's release finishes. Called by the last
    teardown step, or at once when nothing was provisioned; idempotent. Locks the requests, then their allocations,
    in a constant number of queries for any number of requests. After the commit, `allocation_ended` names the
    allocations it ended (metering brings their card-hours into the ledger then)."""
    requests = list(ResourceRequest.objects.select_for_update().filter(pk__in=request_ids).order_by("pk"))
    held = Allocation.objects.filter(request_id__in=request_ids, state=AllocationState.ACTIVE)
    if allocation_ids is not None:
        held = held.filter(pk__in=allocation_ids)
    allocations = list(held.select_for_update().order_by("pk"))
    allocation_release(allocations=allocations, reason=reason)
    if allocations:
        ended = ([allocation.pk for allocation in allocations], sorted({a.request_id for a in allocations}))
        transaction.on_commit(
            lambda: allocation_ended.send(sender=Allocation, allocation_ids=ended[0], request_ids=ended[1])
        )
    released = {allocation.request_id: allocation.release_reason for allocation in allocations}
    for request in requests:
        if request.state == RequestState.RELEASING:
            why = released.get(request.pk, "nothing was bound any more")
            request_finish_release(request=request, message=f"Devices returned to the pool ({why}).")
    return allocations


@transaction.atomic
def allocation_rebind(*, allocation: Allocation) -> Allocation:
    """Bind a released allocation's devices (same shares, same node) to its request again, for an operator's retry
    of a failed provisioning; a serving replica's comes back with the other replicas released with it (returns the
    one given). Refused when the devices, the node or its CPU/memory are no longer free."""
    siblings = (
        Allocation.objects.filter(request_id=allocation.request_id, replica__isnull=False)
        .filter(released_at=allocation.released_at)
        .exclude(pk=allocation.pk)
        .order_by("replica")
        if allocation.replica is not None
        else []
    )
    rebound = _rebind_one(allocation)
    for sibling in siblings:
        _rebind_one(sibling)
    return rebound


def _rebind_one(allocation: Allocation) -> Allocation:
    node = Node.objects.select_for_update().get(pk=allocation.node_id)
    bindings = list(allocation.devices.select_related("device"))
    _check_rebindable(allocation, node, bindings)
    rebound = Allocation.objects.create(
        request_id=allocation.request_id,
        node=node,
        cpu_milli=allocation.cpu_milli,
        memory_mib=allocation.memory_mib,
        priority=allocation.priority,
        preemptible=allocation.preemptible,
        term_started_at=allocation.term_started_at,  # a retry continues the term, it does not restart it
        replica=allocation.replica,
    )
    AllocationDevice.objects.bulk_create(
        [AllocationDevice(allocation=rebound, device=binding.device, milli=binding.milli) for binding in bindings]
    )
    try:
        with transaction.atomic():
            adjust_device_shares({binding.device_id: binding.milli for binding in bindings})
    except IntegrityError as taken:
        raise Conflict(
            "The devices have been given to other work since; the request must be ordered again.",
            code="capacity_taken",
            details={"node": node.name},
        ) from taken
    return rebound


def _check_rebindable(allocation: Allocation, node: Node, bindings: list[AllocationDevice]) -> None:
    if allocation.state != AllocationState.RELEASED or allocation.expires_at <= timezone.now():
        raise Conflict(
            "Only a released allocation that has not expired can be bound again.",
            code="not_rebindable",
            details={"allocation": allocation.pk, "state": allocation.state},
        )
    if not node.schedulable:
        raise Conflict(
            f"{node.name} is isolated: {node.cordon_reason} Clear it before retrying.",
            code="node_isolated",
            details={"node": node.name, "reason": node.cordon_reason},
        )
    unusable = [
        binding.device.uuid
        for binding in bindings
        if binding.device.isolated or binding.device.health == DeviceHealth.UNHEALTHY
    ]
    if unusable:
        raise Conflict(
            "Devices of the allocation are isolated or unhealthy.",
            code="devices_unusable",
            details={"devices": unusable},
        )
    used = Allocation.objects.filter(node=node, state=AllocationState.ACTIVE).aggregate(
        cpu=Coalesce(Sum("cpu_milli"), 0), memory=Coalesce(Sum("memory_mib"), 0)
    )
    if used["cpu"] + allocation.cpu_milli > node.cpu_milli or used["memory"] + allocation.memory_mib > node.memory_mib:
        raise Conflict(
            f"{node.name}'s CPU or memory has been given to other work since.",
            code="capacity_taken",
            details={"node": node.name},
        )


RELEASED, ALREADY_RELEASING, NOT_FOUND, BUSY, HEARTBEAT = (
    "released",
    "already_releasing",
    "not_found",
    "busy",
    "heartbeat",
)
RECLAIMABLE_STATES = (RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE)
RELEASING_STATES = (RequestState.RELEASING, RequestState.RELEASED)


def _locked_first(queryset):
    """(row, None) locked by this transaction; (None, BUSY) when another transaction holds it; (None, NOT_FOUND)."""
    row = queryset.select_for_update(skip_locked=True).first()
    if row is not None:
        return row, None
    return None, BUSY if queryset.exists() else NOT_FOUND


def _due_request_ids(due: Q) -> list[int]:
    """Candidates only: each is decided again on its locked rows."""
    return list(
        Allocation.objects.filter(due, state=AllocationState.ACTIVE)
        .order_by("request_id")
        .values_list("request_id", flat=True)
        .distinct()
    )


def _reclaim_one(*, request_id: int, due: Q, reason: str) -> str:
    """Release the request if its active allocation is still due: one transaction, request then allocation
    locked (the order allocation_free takes them in), nothing waited for."""
    with transaction.atomic():
        request, outcome = _locked_first(ResourceRequest.objects.filter(pk=request_id))
        if request is None:
            return outcome
        if request.state in RELEASING_STATES:
            return ALREADY_RELEASING
        allocation, outcome = _locked_first(
            Allocation.objects.filter(due, request_id=request_id, state=AllocationState.ACTIVE)
        )
        if allocation is None:
            return outcome
        if request.state not in RECLAIMABLE_STATES:
            return NOT_FOUND
        request_release(request=request, actor=None, reason=reason)
        return RELEASED


def _reclaim_each(request_ids: Iterable[int], due: Q, reason: str) -> dict[int, str]:
    return {request_id: _reclaim_one(request_id=request_id, due=due, reason=reason) for request_id in request_ids}


def _warn_one(allocation_id: int, due: Q, now) -> bool:
    with transaction.atomic():
        allocation, _ = _locked_first(Allocation.objects.filter(due, pk=allocation_id).select_related("request"))
        if allocation is None:
            return False
        record_event(
            request=allocation.request,
            actor=None,
            code=EventCode.EXPIRY_WARNING,
            message=f"Expires at {allocation.expires_at:%Y-%m-%d %H:%M} UTC; release or ask for an "
            "extension before then.",
            data={"expires_at": allocation.expires_at.isoformat()},
        )
        Allocation.objects.filter(pk=allocation.pk).update(expiry_warned_at=now)
        return True


# An extension applied since the last warning moved the end: the new end gets its own warning.
_extended_since_warned = RequestExtension.objects.filter(
    request_id=OuterRef("request_id"), state=ChangeState.APPLIED, decided_at__gte=OuterRef("expiry_warned_at")
)


def _warned_from():
    """When an allocation's expiry warning is due: EXPIRY_WARNING_HOURS before its term ends, or halfway through a
    term shorter than twice that (a one-hour order is warned at 30 minutes, not the moment it starts)."""
    lead = Least(Minutes(Value(settings.EXPIRY_WARNING_HOURS * 60)), Minutes(F("request__duration_hours") * 30))
    return ExpressionWrapper(ENDS_AT - lead, output_field=DateTimeField())


def warn_expiring(*, now=None) -> int:
    """Put one warning on the timeline of each running request whose allocation's warning is due (`_warned_from`),
    and one more after each extension (each decided on its locked row, so two workers never warn twice and an
    extension approved meanwhile is seen). A request still being set up, failed or on its way out is not warned:
    there is nothing running to extend or save."""
    now = now or timezone.now()
    due = Q(
        LessThanOrEqual(_warned_from(), now),
        GreaterThan(ENDS_AT, now),
        state=AllocationState.ACTIVE,
        request__state=RequestState.ACTIVE,
    ) & (Q(expiry_warned_at__isnull=True) | Q(Exists(_extended_since_warned)))
    candidates = Allocation.objects.filter(due).order_by("pk").values_list("pk", flat=True)
    return sum(_warn_one(allocation_id, due, now) for allocation_id in list(candidates))


def allocations_reclaim(*, now=None) -> int:
    """The periodic pass: warn what expires soon, then release what has expired or gone stale; how many were
    released."""
    warn_expiring(now=now)
    outcomes = [
        *reclaim_expired(now=now).values(),
        *reclaim_stale(now=now).values(),
        *reclaim_no_shows(now=now).values(),
    ]
    return outcomes.count(RELEASED)


def reclaim_expired(*, now=None) -> dict[int, str]:
    """Release every request whose approved duration is over, through its active allocation's term or, holding none
    (a serving endpoint scaled to zero), through the term its first allocation began; the outcome per request id."""
    now = now or timezone.now()
    due, reason = Q(LessThanOrEqual(ENDS_AT, now)), "expired: the approved duration is over"
    asleep = _asleep_past_term(now)
    return {
        **_reclaim_each(_due_request_ids(due), due, reason),
        **{
            request_id: _reclaim_asleep(request_id, asleep, reason)
            for request_id in asleep.values_list("pk", flat=True)
        },
    }


def _asleep_past_term(now):
    """Active requests that hold no allocation (an endpoint scaled to zero) and whose term is over."""
    holding = Allocation.objects.filter(request_id=OuterRef("pk"), state=AllocationState.ACTIVE)
    ends_at = ExpressionWrapper(F("term_started_at") + Hours("duration_hours"), output_field=DateTimeField())
    return (
        ResourceRequest.objects.filter(state=RequestState.ACTIVE)
        .exclude(Exists(holding))
        .alias(term_started_at=Min("allocations__term_started_at"))
        .filter(LessThanOrEqual(ends_at, now))
        .order_by("pk")
    )


def _reclaim_asleep(request_id: int, asleep, reason: str) -> str:
    """Decided again on the locked request (PostgreSQL locks no aggregate: the lock first, then the check)."""
    with transaction.atomic():
        request, outcome = _locked_first(ResourceRequest.objects.filter(pk=request_id))
        if request is None:
            return outcome
        if not asleep.filter(pk=request_id).exists():
            return NOT_FOUND
        request_release(request=request, actor=None, reason=reason)
        return RELEASED


def reclaim_no_shows(*, now=None) -> dict[int, str]:
    """Release the advance reservations with nothing running RESERVATION_NO_SHOW_MINUTES after their start (still
    allocated or provisioning: no workload delivered). Their held hours stay metered: a reservation's card-hours
    count from its allocation, not from its workload (scheduling.allocations.allocations_meter_from_workload)."""
    minutes = settings.RESERVATION_NO_SHOW_MINUTES
    due = Q(
        request__reserved_start__lte=(now or timezone.now()) - timedelta(minutes=minutes),
        request__state__in=[RequestState.ALLOCATED, RequestState.PROVISIONING],
    )
    return _reclaim_each(
        _due_request_ids(due), due, f"no-show: nothing ran {minutes} minutes after the reservation's start"
    )


def reclaim_stale(*, now=None) -> dict[int, str]:
    """Allocations whose runtime has stopped reporting for longer than the heartbeat timeout. A serving request is
    stale only when every replica is: one node gone quiet takes only its replica out (the health check finds it
    unreachable), not the endpoint."""
    now = now or timezone.now()
    cutoff = now - timedelta(minutes=settings.ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES)
    live_replica = Allocation.objects.filter(
        Q(heartbeat_at__isnull=True) | Q(heartbeat_at__gte=cutoff),
        request_id=OuterRef("request_id"),
        state=AllocationState.ACTIVE,
        replica__isnull=False,
    )
    due = Q(heartbeat_at__lt=cutoff) & ~Q(Exists(live_replica))
    return _reclaim_each(
        _due_request_ids(due),
        due,
        f"stale: no heartbeat from the runtime for {settings.ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES} minutes",
    )


@transaction.atomic
def requeue_from_device(*, device_id: int) -> list[int]:
    """Requests running on an isolated device give it back and return to the queue (SCHEDULER_REQUEUE_ON_ISOLATION);
    a cycle runs after the commit. A serving request with replicas elsewhere stays: only the replica on the device
    leaves the rotation.

    Their approved snapshot stays the contract; the next cycle places them on healthy hardware.
    """
    running = list(
        ResourceRequest.objects.select_for_update()
        .filter(
            state__in=PREEMPTABLE_STATES,
            pk__in=Allocation.objects.filter(state=AllocationState.ACTIVE, devices__device_id=device_id).values(
                "request_id"
            ),
        )
        .exclude(pk__in=replicas_serving_without(device_id=device_id).values("request_id"))
        .order_by("pk")
    )
    if not running:
        return []
    requests_requeue(
        requests=running,
        reason=f"requeued: device #{device_id} was isolated",
        message="Requeued: a device of the allocation was isolated; the request waits for healthy hardware.",
        data={"device": device_id},
    )
    return [request.pk for request in running]


def requests_requeue(*, requests: list[ResourceRequest], reason: str, message: str, data: dict) -> None:
    """Requests the caller has locked (allocated, provisioning or active) give their devices back and return to the
    queue, `message` on each timeline (as a preemption: the request_preempted signal tears down what was built); a
    cycle places them again after the commit. Their approved snapshot stays the contract."""
    allocation_free(request_ids=[request.pk for request in requests], reason=reason)
    requests_preempt(preempted=[(request, None, message, data) for request in requests])
    transaction.on_commit(lambda: async_task(CYCLE_TASK))


@dataclass
class RuntimeOutcome:
    results: dict[int, str]  # request id -> outcome
    refused: list[dict] = field(default_factory=list)  # {code: not_your_node, message, details} per refused item


def _heartbeat(request_ids: list[int], on_nodes: Q, now, with_sessions: set[int]) -> dict[int, str]:
    """Refresh the heartbeat of the active allocations not locked elsewhere, in one transaction; those of
    `with_sessions` (requests with an SSH or Jupyter session open) also mark the session seen."""
    if not request_ids:
        return {}
    active = Allocation.objects.filter(on_nodes, state=AllocationState.ACTIVE, request_id__in=request_ids)
    with transaction.atomic():
        locked = dict(active.select_for_update(skip_locked=True).values_list("pk", "request_id"))
        Allocation.objects.filter(pk__in=locked).update(heartbeat_at=now)
        in_session = [pk for pk, request_id in locked.items() if request_id in with_sessions]
        Allocation.objects.filter(pk__in=in_session).update(session_seen_at=now)
        held_elsewhere = set(active.exclude(pk__in=locked).values_list("request_id", flat=True))
    beaten = set(locked.values())
    return {
        request_id: HEARTBEAT if request_id in beaten else BUSY if request_id in held_elsewhere else NOT_FOUND
        for request_id in request_ids
    }


def _foreign(request_ids: Iterable[int], scope: NodeScope) -> list[int]:
    """Requests whose active allocation is on a node the sender does not speak for (nodes never change)."""
    if scope.nodes is None or not request_ids:
        return []
    on_nodes = Allocation.objects.filter(state=AllocationState.ACTIVE, request_id__in=request_ids)
    return sorted(set(on_nodes.exclude(node_id__in=scope.nodes).values_list("request_id", flat=True)))


def runtime_report(
    *, reports: list[tuple[int, str]], scope: NodeScope = ANY_NODE, now=None, with_sessions: Iterable[int] = ()
) -> RuntimeOutcome:
    """What the runtime (agents on the nodes) says about requests' workloads: "running" refreshes the heartbeat
    (and, for the requests in `with_sessions`, the last time someone had a session open on it: idle detection),
    "gone" reclaims the allocation at once. Reports about allocations outside the sender's nodes are refused
    (not_your_node) and change nothing; every other item is decided on its own locked rows."""
    now = now or timezone.now()
    statuses = dict(reports)
    refused = _foreign(statuses, scope)
    # Checked again on the locked rows: an allocation placed on another node meanwhile is not this sender's.
    on_nodes = Q() if scope.nodes is None else Q(node_id__in=scope.nodes)
    for request_id in refused:
        del statuses[request_id]
    results = dict.fromkeys(refused, NOT_YOUR_NODE)
    running = [request_id for request_id, status in statuses.items() if status == "running"]
    gone = [request_id for request_id, status in statuses.items() if status == "gone"]
    results.update(_heartbeat(running, on_nodes, now, set(with_sessions)))
    results.update(_reclaim_each(gone, on_nodes, "stale: the runtime reports the workload gone"))
    return RuntimeOutcome(results, [scope.refusal({"request": request_id}) for request_id in refused])
