"""An idle serving endpoint scaled to zero replicas: out of the gateways' rotation (its route, keys and record stay),
its inference servers stopped and its replicas' allocations returned, so its capacity and card-hours stop. The next
call wakes it (serving.deployments.deployment_wake): one replica, through the queue, the scheduler and the
MODEL_SERVING pipeline again."""

from django.db import transaction

from provisioning.choices import RunKind
from provisioning.drivers import serving_driver
from provisioning.models import ProvisioningRun
from provisioning.targets import allocation_target
from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling.reclaim import allocation_free
from serving.deployments import deployment_scale_to_zero


@transaction.atomic
def endpoint_scale_to_zero(*, request_id: int, reason: str) -> dict:
    """Scale the active request's endpoint to zero: the route leaves the rotation first (every gateway within a
    poll), then each replica's server is stopped where it runs and the allocations go back to the pool. Nothing
    happens to a request no longer active or an endpoint not serving (released or scaled down meanwhile)."""
    request = ResourceRequest.objects.select_for_update().filter(pk=request_id, state=RequestState.ACTIVE).first()
    replicas = deployment_scale_to_zero(request=request) if request else None
    if replicas is None:
        return {"scaled_to_zero": False}
    run = ProvisioningRun.objects.filter(request=request, kind=RunKind.PROVISION).latest("pk")
    driver = serving_driver((request.approved_spec.get("serving") or {}).get("runtime", "simulated"))
    stopped = {
        replica.name: driver.stop_inference(allocation_target(run, replica.allocation), replica.pid)
        for replica in replicas
        if replica.allocation is not None
    }
    returned = allocation_free(request_ids=[request_id], reason=reason)
    return {"scaled_to_zero": True, "stopped": stopped, "allocations_returned": [a.pk for a in returned]}
