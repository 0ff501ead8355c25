"""An idle serving endpoint scaled to zero replicas: out of the gateways' rotation (its route, keys and record stay),
its inference servers stopped, then their allocations returned, so its capacity and card-hours stop. The next call
wakes it (serving.deployments.deployment_wake): one replica, through the queue, the scheduler and the MODEL_SERVING
pipeline again.

Three steps, so that no row stays locked while a node answers and no card is freed under a running server: a short
transaction takes the deployment out of rotation (`scaling_to_zero`, which a wake and a release see); the servers
are stopped with no transaction open; a second short transaction frees the cards of those that stopped and, once all
have, puts the deployment at zero. A server that did not stop keeps its replica and its cards, with the reason on
the replica and the timeline, and the minute sweeper tries again (scale_downs_resume)."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from provisioning.choices import RunKind
from provisioning.drivers import serving_driver
from provisioning.drivers.base import StepError
from provisioning.models import ProvisioningRun
from provisioning.targets import allocation_target
from provisioning.wiring import SCALE_TO_ZERO_TASK
from requests.choices import EventCode, RequestState
from requests.models import ResourceRequest
from requests.services import record_event
from scheduling.choices import AllocationState
from scheduling.models import RUN_ANCHOR, Allocation
from scheduling.reclaim import allocation_free
from serving.choices import DeploymentState
from serving.deployments import deployment_at_zero, deployment_scale_to_zero
from serving.models import ServingDeployment, ServingReplica

logger = logging.getLogger(__name__)


def endpoint_scale_to_zero(*, request_id: int, reason: str) -> dict:
    """Scale the active request's endpoint to zero, or go on with a scale-down begun before (idempotent); returns
    whether it is at zero, the servers stopped and the allocations returned. Nothing happens to a request no longer
    active or an endpoint neither serving nor scaling to zero (released, or at zero already)."""
    replicas = _leave_rotation(request_id)
    if replicas is None:
        return {"scaled_to_zero": False}
    run = (
        ProvisioningRun.objects.select_related("request")
        .filter(request_id=request_id, kind=RunKind.PROVISION)
        .latest("pk")
    )
    driver = serving_driver((run.request.approved_spec.get("serving") or {}).get("runtime", "simulated"))
    stopped, not_stopped = {}, {}
    for replica in replicas:
        if replica.allocation is None:  # nowhere known to run
            continue
        try:
            stopped[replica.name] = driver.stop_inference(allocation_target(run, replica.allocation), replica.pid)
        except Exception as error:  # whatever the node answered, the server may still run: it keeps its cards
            not_stopped[replica.pk] = _not_stopped_reason(replica, error)
    return {"stopped": stopped, **_free_stopped(request_id, not_stopped, reason)}


@transaction.atomic
def _leave_rotation(request_id: int) -> list[ServingReplica] | None:
    """The first step, on the locked request: out of rotation; the replicas whose servers are to be stopped."""
    request = ResourceRequest.objects.select_for_update().filter(pk=request_id, state=RequestState.ACTIVE).first()
    return deployment_scale_to_zero(request=request) if request else None


def _not_stopped_reason(replica: ServingReplica, error: Exception) -> dict:
    if isinstance(error, StepError):
        code, message = error.code, error.message
    else:  # not a backend's answer the driver classified: a fault of ours, logged with its trace
        logger.exception("Stopping the server of %s failed", replica)
        code, message = "stop_failed", f"{type(error).__name__}: {error}"
    details = {"replica": replica.name, "node": replica.allocation.node.name, "pid": replica.pid}
    return {"code": code, "message": message[:300], "details": details}  # as long as the replica's last_error


@transaction.atomic
def _free_stopped(request_id: int, not_stopped: dict[int, dict], reason: str) -> dict:
    """The last step, on the locked request and deployment: the replicas whose server stopped go, and their cards
    with them; one whose server did not stop keeps its cards and shows why. Nothing is freed once the request is no
    longer active or the deployment no longer scaling to zero: a release took over, whose teardown stops the servers
    again before it frees their cards."""
    request = ResourceRequest.objects.select_for_update().get(pk=request_id)
    deployment = ServingDeployment.objects.select_for_update().get(request=request)
    if request.state != RequestState.ACTIVE or deployment.state != DeploymentState.SCALING_TO_ZERO:
        return {"scaled_to_zero": False, "allocations_returned": []}
    replicas = list(deployment.replicas.all())
    running = [replica for replica in replicas if replica.pk in not_stopped]
    _record_not_stopped(request, running, not_stopped)
    kept = {replica.allocation_id for replica in running}
    if running:  # a release tears down on the run's anchor allocation: it goes back last
        anchors = Allocation.objects.filter(RUN_ANCHOR, request=request, state=AllocationState.ACTIVE)
        kept |= set(anchors.values_list("pk", flat=True))
    gone = [replica for replica in replicas if replica.allocation_id not in kept]
    returned = allocation_free(
        request_ids=[request_id],
        reason=reason,
        allocation_ids={replica.allocation_id for replica in gone if replica.allocation_id} if running else None,
    )
    ServingReplica.objects.filter(pk__in=[replica.pk for replica in gone]).delete()
    # Stopped, but kept with the cards a running sibling keeps: no pid, so a retry signals no process reusing it.
    deployment.replicas.exclude(pk__in=not_stopped).update(pid=None)
    if not running:
        deployment_at_zero(request=request, deployment=deployment)
    return {"scaled_to_zero": not running, "allocations_returned": [allocation.pk for allocation in returned]}


def _record_not_stopped(request: ResourceRequest, running: list[ServingReplica], not_stopped: dict[int, dict]) -> None:
    """Each replica shows why its server did not stop; the timeline says so once per new reason, not at each retry."""
    new = [replica for replica in running if replica.last_error != not_stopped[replica.pk]["message"]]
    for replica in running:
        replica.healthy, replica.last_error = False, not_stopped[replica.pk]["message"]
    ServingReplica.objects.bulk_update(running, ["healthy", "last_error"])
    if new:
        reasons = [not_stopped[replica.pk] for replica in new]
        record_event(
            request=request,
            actor=None,
            code=EventCode.REPLICA_NOT_STOPPED,
            message="Scaling to zero: "
            + "; ".join(f"the server of {r['details']['replica']} did not stop ({r['message']})" for r in reasons)
            + ". It keeps its cards until it stops; the sweeper tries again every minute.",
            data={"reasons": reasons},
        )


def scale_downs_resume(*, limit: int = 100) -> list[int]:
    """The minute sweeper's net under scale-downs: an active request's endpoint scaling to zero for longer than
    PROVISIONING_RELEASE_GRACE_SECONDS lost its task, or has a server that did not stop. Go on with it in a task
    (endpoint_scale_to_zero is idempotent, so a late original changes nothing). Returns the request ids."""
    cutoff = timezone.now() - timedelta(seconds=settings.PROVISIONING_RELEASE_GRACE_SECONDS)
    request_ids = list(
        ServingDeployment.objects.filter(
            state=DeploymentState.SCALING_TO_ZERO, scaled_to_zero_at__lt=cutoff, request__state=RequestState.ACTIVE
        )
        .order_by("scaled_to_zero_at")
        .values_list("request_id", flat=True)[:limit]
    )
    for request_id in request_ids:
        async_task(SCALE_TO_ZERO_TASK, request_id, "scaled to zero: resumed by the sweeper")
    return request_ids
