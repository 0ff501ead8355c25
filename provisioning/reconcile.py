"""Backends are reconciled, not trusted: the minute schedule asks each execution backend which of the platform's
active workloads have ended by themselves (a Slurm job that completed, failed, timed out, lost its node or was
cancelled outside the platform) and settles each request with the backend's reason: released through the release
pipeline, or failed with the exit code, whose cleanup run gives the devices back. This is the stale-allocation
cleanup for backends that can be asked, instead of heartbeats.

Each request is decided on its own locked row (SKIP LOCKED: a release or a step holding it is looked at again on
the next pass); a backend that cannot be asked reclaims nothing.
"""

import logging
from collections import defaultdict

from django.db import transaction

from provisioning.choices import RunKind, RunState
from provisioning.drivers import workload_driver
from provisioning.drivers.base import StepError, Target, WorkloadEnd
from provisioning.models import ProvisioningRun
from provisioning.services import teardown_start
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.services import request_fail, request_release
from scheduling.choices import AllocationState, ExecutionBackend

logger = logging.getLogger(__name__)

RELEASED, FAILED, MOVED_ON, BUSY, BACKEND_UNREACHABLE = "released", "failed", "moved_on", "busy", "backend_unreachable"


def workloads_reconcile() -> dict[int, str]:
    """Settle every active request whose workload ended by itself; the outcome per request id."""
    outcome = {}
    for backend, runs in _delivered_runs().items():
        targets = {run.allocation_id: _target(run) for run in runs}
        try:
            ended = workload_driver(backend).ended_workloads(targets.values())
        except StepError as unreachable:
            logger.warning("Cannot reconcile %s workloads: %s", backend, unreachable.message)
            outcome.update(dict.fromkeys((run.request_id for run in runs), BACKEND_UNREACHABLE))
            continue
        for run in runs:
            if run.allocation_id in ended:
                outcome[run.request_id] = _settle(run, ended[run.allocation_id])
    return outcome


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
    """Enough for the backend to find the workload (the devices are not needed to ask whether it ended)."""
    node = run.allocation.node
    return Target(
        run_id=run.pk,
        request_id=run.request_id,
        node=node.name,
        devices=(),
        snapshot=run.request.approved_spec,
        backend=node.execution_backend,
        allocation_id=run.allocation_id,
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
            data={"run": run.pk},
        )
        teardown_start(request_id=request.pk, reason=f"workload ended: {end.state}", kind=RunKind.CLEANUP)
        return FAILED
