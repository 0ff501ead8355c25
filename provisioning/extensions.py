"""An approved extension reaches the backend: the end the backend enforces on the workload (a Slurm job's time limit)
moves out to the request's new term, and the record says so.

Three places apply it, so that no order of events leaves a workload with the old end:
- `workload_extend` (task after the extension's commit, requests.signals.request_extended): the workload running
  now;
- the readiness check (provisioning/drivers/slurm.py): a job submitted while the extension was being approved;
- the reconciler's minute pass (provisioning/reconcile.py): whatever the first could not reach (Slurm down).
The allocation's expiry needs nothing: it is derived from the request's duration.
"""

import logging

from django.db import transaction

from provisioning.choices import RunKind, RunState, StepState
from provisioning.drivers import workload_driver
from provisioning.drivers.base import StepError
from provisioning.models import ProvisioningRun
from provisioning.targets import run_target
from requests.choices import EventCode, RequestState
from requests.services import record_event
from scheduling.choices import AllocationState

logger = logging.getLogger(__name__)

MOVED, NOTHING_TO_MOVE, NOT_STARTED, BACKEND_UNREACHABLE = "moved", "nothing_to_move", "not_started", "unreachable"


def workload_extend(*, request_id: int) -> str:
    """Move the end of the request's running workload out to its term; what happened (MOVED, ...)."""
    run = (
        ProvisioningRun.objects.filter(
            request_id=request_id,
            kind=RunKind.PROVISION,
            state__in=(RunState.RUNNING, RunState.SUCCEEDED),
            allocation__state=AllocationState.ACTIVE,
            request__state__in=(RequestState.PROVISIONING, RequestState.ACTIVE),
        )
        .select_related("request__requester", "allocation__node")
        .order_by("-pk")
        .first()
    )
    if run is None:
        return NOTHING_TO_MOVE
    if run.state == RunState.RUNNING and not run.steps.filter(name="start_workload", state=StepState.SUCCEEDED):
        return NOT_STARTED  # the workload starts with the new term (or the readiness check moves it)
    target = run_target(run)
    try:
        moved = workload_driver(target.backend).extend_workloads([target])
    except StepError as error:
        record_event(
            request=run.request,
            actor=None,
            code=EventCode.WORKLOAD_EXTENDED,
            message=f"The {target.backend} backend could not be told of the extension yet ({error.message}); the "
            "reconciler tries again every minute.",
            data={"backend": target.backend, "moved": False, "code": error.code},
        )
        return BACKEND_UNREACHABLE
    workload_extended_note(run, moved.get(run.allocation_id))
    return MOVED if run.allocation_id in moved else NOTHING_TO_MOVE


@transaction.atomic
def workload_extended_note(run: ProvisioningRun, moved: dict | None) -> None:
    """The new end on the request record (the run's delivered access) and, when the backend's end moved (`moved`,
    what the driver changed), on the timeline."""
    run = (
        ProvisioningRun.objects.select_for_update(of=("self",))
        .select_related("request", "allocation__request", "allocation__node")
        .get(pk=run.pk)
    )
    if run.delivered:
        run.delivered = {
            **run.delivered,
            **({"time_limit_minutes": moved["time_limit_minutes"]} if moved else {}),
            "expires_at": run.allocation.expires_at.isoformat(),
        }
        run.save(update_fields=["delivered"])
    if moved is None:
        return
    record_event(
        request=run.request,
        actor=None,
        code=EventCode.WORKLOAD_EXTENDED,
        message=f"{moved['workload']}: time limit raised from {moved['was_minutes']} to "
        f"{moved['time_limit_minutes']} minutes (via {moved['via']}), the extended term of "
        f"{run.request.duration_hours} hours.",
        data={"backend": run.allocation.node.execution_backend, "moved": True, **moved},
    )
