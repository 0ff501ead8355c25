"""The container backend's reconciler: a workspace container that exited by itself (or was removed outside the
platform) ends its request like a finished job, through provisioning.services.workload_ended."""

import logging
from collections import defaultdict

from provisioning.drivers import workload_driver
from provisioning.drivers.base import StepError
from provisioning.services import workload_ended
from requests.choices import RequestState
from scheduling.choices import AllocationState, ExecutionBackend
from scheduling.models import Allocation

logger = logging.getLogger(__name__)


def containers_reconcile() -> dict[str, list[int]]:
    """Compare each container node's containers with its active allocations; end what has ended. A node podman
    cannot be reached on is left alone (and logged): an unreachable node is not a finished workload."""
    allocations = defaultdict(dict)
    for allocation_id, request_id, node in Allocation.objects.filter(
        state=AllocationState.ACTIVE,
        node__execution_backend=ExecutionBackend.CONTAINER,
        request__state=RequestState.ACTIVE,
    ).values_list("pk", "request_id", "node__name"):
        allocations[node][allocation_id] = request_id
    driver = workload_driver(ExecutionBackend.CONTAINER)
    outcome = defaultdict(list)
    for node, requests_by_allocation in allocations.items():
        try:
            ended = driver.ended_workloads(node, set(requests_by_allocation))
        except StepError as unreachable:
            logger.warning("Container reconciliation skipped node %s: %s", node, unreachable.message)
            continue
        for allocation_id, workload in ended.items():
            request_id = requests_by_allocation[allocation_id]
            result = workload_ended(
                request_id=request_id,
                exit_code=workload["exit_code"],
                message=_sentence(node, workload),
                details={"node": node, **workload},
            )
            if result:
                outcome[result].append(request_id)
    return dict(outcome)


def _sentence(node: str, workload: dict) -> str:
    if workload["exit_code"] is None:
        return f"The workspace container on {node} is gone (removed outside the platform)."
    return f"The workspace container on {node} exited by itself with code {workload['exit_code']}."
