"""Backends are reconciled, not trusted: the minute schedule asks each execution backend which of the platform's
active workloads have ended by themselves (a Slurm job that completed, failed, timed out, lost its node or was
cancelled outside the platform) and settles each request with the backend's reason: released through the release
pipeline, or failed with the exit code, whose cleanup run gives the devices back. This is the stale-allocation
cleanup for backends that can be asked, instead of heartbeats. The same pass raises the end a backend enforces
(a Slurm job's time limit) where an approved extension has not reached it yet.

Each request is decided on its own locked row (SKIP LOCKED: a release or a step holding it is looked at again on
the next pass); a backend that cannot be asked reclaims nothing, and when the whole of it does not answer it is
marked degraded (and cleared by its next answer), so new orders wait for it even when nothing is being provisioned.
"""

import logging
from collections import defaultdict

from django.db import transaction
from django_q.tasks import async_task

from provisioning import outages
from provisioning.choices import RunKind, RunState
from provisioning.drivers import workload_driver
from provisioning.drivers.base import BackendUnavailable, StepError, Target, WorkloadEnd
from provisioning.extensions import workload_extended_note
from provisioning.models import ProvisioningRun
from provisioning.services import teardown_start
from provisioning.targets import gang_of
from requests.choices import EventCode, RequestState
from requests.models import ResourceRequest
from requests.services import record_event, request_fail, request_release
from scheduling import backends
from scheduling.choices import AllocationState, ExecutionBackend
from scheduling.models import Allocation, Node

logger = logging.getLogger(__name__)

RELEASED, FAILED, MOVED_ON, BUSY = "released", "failed", "moved_on", "busy"
BACKEND_UNREACHABLE, ORPHAN_STOPPED = "backend_unreachable", "orphan_stopped"


def workloads_reconcile() -> dict[int, str]:
    """Settle every active request whose workload ended by itself, and stop workloads left behind by a teardown
    that could not reach the backend; the outcome per request id."""
    outcome = {}
    for backend in backends.backends_unwatched():  # out longer than a watcher watches, or its worker died
        async_task(outages.WATCH_TASK, backend)
    delivered = _delivered_runs()
    for backend in _reconciled_backends():
        runs = delivered.get(backend, [])
        driver = workload_driver(backend)
        try:
            ended = driver.ended_workloads([_target(run) for run in runs])
            orphans = driver.stop_orphans(_held)
        except StepError as unreachable:
            logger.warning("Cannot reconcile %s workloads: %s", backend, unreachable.message)
            outcome.update(dict.fromkeys((run.request_id for run in runs), BACKEND_UNREACHABLE))
            if isinstance(unreachable, BackendUnavailable):
                outages.backends_seen(unavailable=[unreachable], answered=set())
            continue
        outages.backends_seen(unavailable=[], answered={backend})
        for run in runs:
            if run.allocation_id in ended:
                outcome[run.request_id] = _settle(run, ended[run.allocation_id])
        _extend([run for run in runs if run.allocation_id not in ended], driver)
        for orphan in orphans:
            _note_orphan(orphan)
            outcome.setdefault(orphan["request_id"], ORPHAN_STOPPED)
    return outcome


def _extend(runs: list[ProvisioningRun], driver) -> None:
    """Workloads still running with an end short of their request's term (an extension the task after its approval
    could not bring to the backend) get it now."""
    try:
        moved = driver.extend_workloads([_target(run) for run in runs])
    except StepError as refused:
        logger.warning("Cannot extend %s workloads: %s", driver.name, refused.message)
        return
    for run in runs:
        if run.allocation_id in moved:
            workload_extended_note(run, moved[run.allocation_id])


def _reconciled_backends() -> list[str]:
    """The backends of the inventory whose workloads can end, or be left behind, without the platform."""
    return list(
        Node.objects.exclude(execution_backend=ExecutionBackend.SIMULATED)
        .order_by("execution_backend")
        .values_list("execution_backend", flat=True)
        .distinct()
    )


def _held(allocation_ids: set[int]) -> set[int]:
    return set(
        Allocation.objects.filter(pk__in=allocation_ids, state=AllocationState.ACTIVE).values_list("pk", flat=True)
    )


def _note_orphan(orphan: dict) -> None:
    request = ResourceRequest.objects.filter(pk=orphan["request_id"]).first()
    if request is not None:
        record_event(
            request=request,
            actor=None,
            code=EventCode.CLEANED_UP,
            message=f"The reconciler stopped {orphan['workload']}, left running for allocation "
            f"#{orphan['allocation_id']} which the request no longer holds.",
            data=orphan,
        )


def _delivered_runs() -> dict[str, list[ProvisioningRun]]:
    """The succeeded provisioning runs of active requests on backends whose workloads can end by themselves."""
    runs = (
        ProvisioningRun.objects.filter(
            kind=RunKind.PROVISION,
            state=RunState.SUCCEEDED,
            request__state=RequestState.ACTIVE,
            allocation__state=AllocationState.ACTIVE,
        )
        .exclude(allocation__node__execution_backend=ExecutionBackend.SIMULATED)
        .select_related("allocation__node", "request")
        .order_by("pk")
    )
    by_backend = defaultdict(list)
    for run in runs:
        by_backend[run.allocation.node.execution_backend].append(run)
    return by_backend


def _target(run: ProvisioningRun) -> Target:
    """Enough for the backend to find the workload (the devices are not needed to ask whether it ended); a gang's
    members, whose workloads on their own nodes end the gang (two queries per gang)."""
    node = run.allocation.node
    return Target(
        run_id=run.pk,
        request_id=run.request_id,
        node=node.name,
        devices=(),
        snapshot=run.request.approved_spec,
        backend=node.execution_backend,
        allocation_id=run.allocation_id,
        duration_hours=run.request.duration_hours,
        gang=gang_of(run.allocation),
    )


def _settle(run: ProvisioningRun, end: WorkloadEnd) -> str:
    with transaction.atomic():
        request = ResourceRequest.objects.select_for_update(skip_locked=True).filter(pk=run.request_id).first()
        if request is None:
            return BUSY
        if request.state != RequestState.ACTIVE:
            return MOVED_ON
        if not end.failed:
            request_release(request=request, actor=None, reason=f"{end.message}.")
            return RELEASED
        failure = {"step": "workload", "code": "workload_failed", "message": end.message, "attempts": 1}
        request_fail(
            request=request,
            failure={**failure, "details": end.details},
            message=f"The workload ended by itself: {end.message}.",
            data={"run": run.pk, "operator_retry": False},  # its run succeeded: there is no failed step to retry
        )
        teardown_start(request_id=request.pk, reason=f"workload ended: {end.state}", kind=RunKind.CLEANUP)
        return FAILED
