"""Deployments of served models: their replicas (inference processes started by the host driver), health, and
the endpoint the gateway publishes."""

import contextlib
import json

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify

from config.errors import Conflict
from requests.models import ResourceRequest
from requests.services import request_ask_for_capacity
from scheduling.choices import DeviceHealth
from scheduling.models import Allocation, AllocationDevice
from serving.choices import DeploymentState
from serving.models import ServingDeployment, ServingReplica
from serving.routes import routes_changed

HEALTH_TIMEOUT_SECONDS = 2.0


def served_model_id(serving: dict) -> str:
    """The model id clients send and /v1/models lists: the catalog model's name."""
    return serving.get("model_name") or serving["model"]


def deployment_for(request) -> ServingDeployment:
    """The request's deployment, created on first use from its approved snapshot (idempotent)."""
    serving, parameters = request.approved_spec["serving"], request.approved_spec.get("parameters") or {}
    deployment, _ = ServingDeployment.objects.get_or_create(
        request=request,
        defaults={
            "project_id": request.project_id,
            "slug": f"{slugify(serving['model'])[:60]}-{request.pk}",
            "model_name": served_model_id(serving),
            "rate_limit_per_minute": int(
                parameters.get("rate_limit_per_minute") or settings.SERVING_DEFAULT_RATE_LIMIT_PER_MINUTE
            ),
            "monthly_token_budget": int(parameters["monthly_token_budget"])
            if parameters.get("monthly_token_budget")
            else None,
        },
    )
    return deployment


@transaction.atomic
def deployment_serve(*, deployment: ServingDeployment) -> ServingDeployment:
    """Let the gateway route to the deployment; a step run again finds it serving already."""
    deployment = ServingDeployment.objects.select_for_update().get(pk=deployment.pk)
    if deployment.state != DeploymentState.SERVING:
        deployment.serve()
        deployment.save(update_fields=["state", "stopped_at"])
    return deployment


@transaction.atomic
def deployment_stop(*, request) -> int:
    """Take the request's deployment (if it has one) out of the gateway; how many routes that removes."""
    deployment = ServingDeployment.objects.select_for_update().filter(request=request).first()
    if deployment is None:
        return 0
    if deployment.state != DeploymentState.STOPPED:
        deployment.stop()
        deployment.save(update_fields=["state", "stopped_at"])
    return 1


def replica_devices(devices: list[dict], replicas: int) -> list[list[dict]]:
    """One allocation's devices split evenly between the replicas it holds together (the MIG engine places a
    deployment's slices on one node; requests allocated before replicas had allocations of their own)."""
    per_replica = max(1, len(devices) // replicas)
    return [list(devices[i * per_replica : (i + 1) * per_replica]) for i in range(replicas)]


def placement_problems(replicas: list[ServingReplica]) -> dict[int, str]:
    """Why a replica's placement cannot serve, by replica id: its node cordoned, or a card it runs on isolated or
    unhealthy (three queries). Such a replica stays out of rotation however its process answers: the node is being
    taken out of service, so the deployment serves through its replicas on other nodes. When none of them is in
    service either, they all keep serving where they are (what runs on a cordoned node keeps running)."""
    siblings = list(
        ServingReplica.objects.filter(deployment_id__in={replica.deployment_id for replica in replicas}).values_list(
            "deployment_id", "allocation_id"
        )
    )
    allocation_ids = {allocation_id for _deployment, allocation_id in siblings if allocation_id}
    if not allocation_ids:
        return {}
    problems = {
        allocation_id: f"node {name} cordoned: {reason}"[:300]
        for allocation_id, name, reason in Allocation.objects.filter(
            pk__in=allocation_ids, node__schedulable=False
        ).values_list("pk", "node__name", "node__cordon_reason")
    }
    for allocation_id, uuid, reason, health in AllocationDevice.objects.filter(
        Q(device__isolated=True) | Q(device__health=DeviceHealth.UNHEALTHY), allocation_id__in=allocation_ids
    ).values_list("allocation_id", "device__uuid", "device__isolation_reason", "device__health"):
        problems.setdefault(allocation_id, f"device {uuid} {'isolated: ' + reason if reason else health}"[:300])
    in_service = {deployment for deployment, allocation_id in siblings if allocation_id not in problems}
    return {
        replica.pk: problems[replica.allocation_id]
        for replica in replicas
        if replica.allocation_id in problems and replica.deployment_id in in_service
    }


def endpoint_url(deployment: ServingDeployment, base_url: str | None = None) -> str:
    """The gateway URL of a deployment, under `base_url` when a browser request gave one (its host and port are
    the ones that person reached), else under PUBLIC_BASE_URL (tasks, installers, mails)."""
    path = reverse("serving-gateway", kwargs={"slug": deployment.slug, "path": ""})
    return (base_url or settings.PUBLIC_BASE_URL).rstrip("/") + path.rstrip("/")


def example_curl(url: str, model: str, api_key: str = "$API_KEY") -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello"}]})
    return (
        f'curl {url}/chat/completions -H "Authorization: Bearer {api_key}" '
        f"-H 'Content-Type: application/json' -d '{body}'"
    )


def probe(replica: ServingReplica) -> str:
    """ "" when the replica answers its readiness check (GET /v1/models: every OpenAI-compatible runtime has it, and
    llama.cpp's server, which has no /health, only listens once its model is loaded), else why not."""
    if not replica.url:
        return "not started"
    try:
        answer = httpx.get(f"{replica.url}/v1/models", timeout=HEALTH_TIMEOUT_SECONDS)
    except httpx.HTTPError as error:
        return f"unreachable: {type(error).__name__}"
    return "" if answer.status_code == 200 else f"health check answered {answer.status_code}"


def replicas_check(replicas: list[ServingReplica]) -> list[ServingReplica]:
    """Probe each replica (unless its node or card is out of service) and store its health; returns those that are
    down."""
    now, down, moved = timezone.now(), [], False
    out_of_service = placement_problems(replicas)
    for replica in replicas:
        problem = out_of_service.get(replica.pk) or probe(replica)
        moved = moved or replica.healthy == bool(problem)
        replica.healthy, replica.last_error, replica.checked_at = not problem, problem[:300], now
        if problem:
            down.append(replica)
    ServingReplica.objects.bulk_update(replicas, ["healthy", "last_error", "checked_at"])
    if moved:
        routes_changed()  # a replica left or came back into rotation
    return down


def replicas_not_ready(deployment: ServingDeployment) -> list[ServingReplica]:
    """The replicas whose server does not answer yet (the provisioning step waits for none of them). One on a node
    cordoned meanwhile is not counted (it would never come into rotation): the deployment starts serving through the
    others."""
    replicas = list(deployment.replicas.all())
    out_of_service = placement_problems(replicas)
    return [replica for replica in replicas_check(replicas) if replica.pk not in out_of_service]


@transaction.atomic
def replica_failed(*, replica_id: int, reason: str) -> None:
    """The gateway could not reach it: take it out of rotation until a health check finds it answering (the one
    write a gateway asks of the control plane besides metering)."""
    ServingReplica.objects.filter(pk=replica_id).update(
        healthy=False, last_error=reason[:300], checked_at=timezone.now()
    )
    routes_changed()


def serving_replicas_check(*, node_id: int | None = None) -> int:
    """The minute health check of every serving deployment's replicas (or, when a node's availability changed, of
    those on that node: a cordon takes its replicas out of rotation at once); returns how many are down."""
    replicas = ServingReplica.objects.filter(deployment__state=DeploymentState.SERVING)
    if node_id is not None:
        replicas = replicas.filter(allocation__node_id=node_id)
    return len(replicas_check(list(replicas)))


# --- Scale to zero, and waking on a call ---------------------------------------------------------------------------

WAKE_REPLICAS = 1


@transaction.atomic
def deployment_scale_to_zero(*, request) -> list[ServingReplica] | None:
    """The idle action on an endpoint, first step (the caller has locked the request; it stops the servers once this
    has committed, with no lock held, then frees the cards of those that stopped): a serving deployment leaves the
    gateways' rotation but keeps its route, its keys and its record, `scaling_to_zero`. Returns the replicas whose
    servers are to be stopped: all of them, or on a deployment scaling to zero already (a retry) those still there.
    None when it is neither (released meanwhile, or at zero already)."""
    deployment = ServingDeployment.objects.select_for_update().filter(request=request).first()
    if deployment is None or deployment.state not in (DeploymentState.SERVING, DeploymentState.SCALING_TO_ZERO):
        return None
    if deployment.state == DeploymentState.SERVING:
        deployment.scale_to_zero()
        deployment.save(update_fields=["state", "scaled_to_zero_at"])
        routes_changed()
    return list(deployment.replicas.select_related("allocation__node"))


def deployment_at_zero(*, request, deployment: ServingDeployment) -> str:
    """The last server of a deployment scaling to zero has stopped and the cards are back (the caller holds the
    request's and the deployment's locks): at zero, or woken at once when a call asked meanwhile. A wake the quota
    refuses now leaves it at zero; the next call hears why. Returns the deployment's state."""
    wake, deployment.wake_requested = deployment.wake_requested, False
    deployment.reach_zero()
    deployment.save(update_fields=["state", "wake_requested"])
    if wake:
        with contextlib.suppress(Conflict):
            _wake(request, deployment)
    return deployment.state


def deployment_wake(*, deployment_id: int) -> str:
    """A gateway received a call for a deployment at zero: ask for one replica through the normal path (the quota
    checked as it stands, the queue, the scheduler's placement, provisioning), once however many calls and gateways
    ask (the locked deployment leaves `scaled_to_zero` once). A call while its servers are still stopping is
    remembered, and wakes it once they have (a replica started now could land on cards a stopping server holds).
    Returns the deployment's state afterwards; raises Conflict `quota_exceeded` when the quota no longer holds a
    replica."""
    request_id = ServingDeployment.objects.values_list("request_id", flat=True).get(pk=deployment_id)
    with transaction.atomic():
        request = ResourceRequest.objects.select_for_update().get(pk=request_id)  # the request first, as release
        deployment = ServingDeployment.objects.select_for_update().get(pk=deployment_id)
        if deployment.state == DeploymentState.SCALING_TO_ZERO and not deployment.wake_requested:
            deployment.wake_requested = True
            deployment.save(update_fields=["wake_requested"])
        if deployment.state == DeploymentState.SCALED_TO_ZERO:
            _wake(request, deployment)
        return deployment.state


def _wake(request, deployment: ServingDeployment) -> None:
    request_ask_for_capacity(
        request=request,
        replicas=WAKE_REPLICAS,
        message=f"Woken by a call to {deployment.slug}: asking for {WAKE_REPLICAS} replica again.",
        data={"deployment": deployment.slug, "replicas": WAKE_REPLICAS},
    )
    deployment.wake()
    deployment.save(update_fields=["state"])
