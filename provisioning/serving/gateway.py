"""The gateway: /serve/<deployment>/v1/... authenticates a project API key, enforces the key's rate limit and the
deployment's monthly token budget, balances over healthy replicas (failing over when one does not answer),
streams the answer through, and meters the tokens each answer reports in its `usage`.

A sync view on a shared httpx connection pool: under WSGI each request holds a worker thread; under ASGI Django
runs it in its thread pool. Nothing is kept in process memory between requests but connections and the cache.
"""

import itertools
import json
import logging
import math
import time

import httpx
from django.conf import settings
from django.core.cache import cache
from django.db.models import Prefetch
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from provisioning.choices import DeploymentState
from provisioning.models import ApiKey, ServingDeployment, ServingReplica
from provisioning.serving import usage
from provisioning.serving.deployments import replica_failed
from provisioning.serving.keys import api_key_authenticate

logger = logging.getLogger(__name__)

FORWARDED_HEADERS = ("content-type", "accept")
_client = httpx.Client(
    timeout=httpx.Timeout(settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS, connect=2.0),
    limits=httpx.Limits(max_connections=500, max_keepalive_connections=200),
)
_turns = itertools.count()


class Refusal(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict | None = None, **details):
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.details = status, code, message, headers or {}, details

    def response(self) -> JsonResponse:
        answer = JsonResponse({"code": self.code, "message": self.message, "details": self.details}, status=self.status)
        for name, value in self.headers.items():
            answer[name] = value
        return answer


@csrf_exempt
def serve(request, slug: str, path: str):
    try:
        key, deployment = _admit(request, slug)
        return _forward(request, key, deployment, path)
    except Refusal as refusal:
        return refusal.response()


def _admit(request, slug: str) -> tuple[ApiKey, ServingDeployment]:
    secret = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    key = api_key_authenticate(secret) if secret else None
    if key is None:
        raise Refusal(401, "invalid_api_key", "Send a valid, unrevoked project API key as 'Authorization: Bearer'.")
    deployment = (
        ServingDeployment.objects.filter(slug=slug, state=DeploymentState.SERVING)
        .prefetch_related(
            Prefetch(
                "replicas",
                queryset=ServingReplica.objects.filter(healthy=True).order_by("name"),
                to_attr="healthy_replicas",
            )
        )
        .first()
    )
    if deployment is None:
        raise Refusal(404, "unknown_deployment", f"No deployment '{slug}' is serving.")
    if key.project_id != deployment.project_id:
        raise Refusal(403, "key_not_for_this_deployment", "This key belongs to another project.")
    _check_rate(key, deployment)
    _check_budget(deployment)
    _note_use(key)
    return key, deployment


def _note_use(key: ApiKey) -> None:
    """Last use to the minute: one UPDATE a minute per key, not one per call."""
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() >= 60:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)


def _check_rate(key: ApiKey, deployment: ServingDeployment) -> None:
    """A fixed one-minute window per key and deployment, counted in the shared cache."""
    now = time.time()
    window = int(now // 60)
    counter = f"gateway:rate:{key.pk}:{deployment.pk}:{window}"
    cache.add(counter, 0, timeout=120)
    if cache.incr(counter) > deployment.rate_limit_per_minute:
        retry_after = max(1, math.ceil((window + 1) * 60 - now))
        raise Refusal(
            429,
            "rate_limited",
            f"More than {deployment.rate_limit_per_minute} requests a minute with this key.",
            headers={"Retry-After": str(retry_after)},
            limit=deployment.rate_limit_per_minute,
            retry_after=retry_after,
        )


def _check_budget(deployment: ServingDeployment) -> None:
    if deployment.monthly_token_budget is None:
        return
    used = usage.tokens_this_month(deployment)
    if used >= deployment.monthly_token_budget:
        raise Refusal(
            429,
            "token_budget_exhausted",
            f"The deployment's monthly token budget "
            f"({deployment.monthly_token_budget}) is used up; it renews on the 1st.",
            budget=deployment.monthly_token_budget,
            used=used,
        )


def _forward(request, key: ApiKey, deployment: ServingDeployment, path: str):
    replicas = deployment.healthy_replicas
    if not replicas:
        raise Refusal(
            502, "no_healthy_replica", "No replica of this deployment is healthy right now.", deployment=deployment.slug
        )
    start = next(_turns) % len(replicas)
    for replica in replicas[start:] + replicas[:start]:  # round robin, then fail over
        try:
            upstream = _send(request, replica, path)
        except httpx.TransportError as error:
            replica_failed(replica, f"gateway could not reach it: {type(error).__name__}")
            logger.warning("Replica %s failed: %s", replica, error)
            continue
        return _relay(upstream, key, deployment)
    raise Refusal(
        502,
        "upstream_unavailable",
        "No replica answered; they are marked unhealthy until they recover.",
        deployment=deployment.slug,
    )


def _send(request, replica: ServingReplica, path: str) -> httpx.Response:
    headers = {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
    upstream = _client.build_request(
        request.method, f"{replica.url}/v1/{path}", content=request.body, headers=headers, params=request.GET
    )
    return _client.send(upstream, stream=True)


def _relay(upstream: httpx.Response, key: ApiKey, deployment: ServingDeployment):
    content_type = upstream.headers.get("content-type", "application/json")
    if content_type.startswith("text/event-stream"):
        answer = StreamingHttpResponse(
            _stream(upstream, key, deployment), status=upstream.status_code, content_type=content_type
        )
        answer["Cache-Control"] = "no-cache"
        answer["X-Accel-Buffering"] = "no"
        return answer
    try:
        body = upstream.read()
    finally:
        upstream.close()
    answer = MeteredResponse(body, status=upstream.status_code, content_type=content_type)
    if upstream.status_code == 200:
        answer.meter = lambda: _meter(key, deployment, _usage_of(body))
    return answer


class MeteredResponse(HttpResponse):
    """Meters once the server has sent the body (WSGI servers close the response then): the client does not
    wait for the ledger write."""

    meter = None

    def close(self):
        super().close()
        if self.meter is not None:
            meter, self.meter = self.meter, None
            meter()


def _stream(upstream: httpx.Response, key: ApiKey, deployment: ServingDeployment):
    """Pass the events through as they come; the last `usage` seen is what the answer cost."""
    found = None
    try:
        for line in upstream.iter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                found = _usage_of(line.removeprefix("data: ")) or found
            yield f"{line}\n".encode()
    except httpx.TransportError as error:
        logger.warning("Stream from %s broke: %s", deployment.slug, error)
    finally:
        upstream.close()
        _meter(key, deployment, found)


def _usage_of(body) -> dict | None:
    try:
        return json.loads(body).get("usage") or None
    except (ValueError, AttributeError):
        return None


def _meter(key: ApiKey, deployment: ServingDeployment, found: dict | None) -> None:
    if found:
        usage.tokens_record(
            key=key,
            deployment=deployment,
            prompt=int(found.get("prompt_tokens", 0)),
            completion=int(found.get("completion_tokens", 0)),
            at=timezone.now(),
        )
