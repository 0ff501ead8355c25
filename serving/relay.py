"""/serve/<deployment>/v1/... reached on the web server: handed to the gateway data plane (GATEWAY_URL) unchanged.

The gateway (serving/gateway.py, its own process) is the only data plane: it authenticates, limits,
routes and meters. In production the load balancer sends /serve/ to the gateways directly; this relay only keeps the
published URLs working on a single-address demo (`make run` sets GATEWAY_URL). It decides nothing but what the
gateway would refuse first: a path that would leave the replica's /v1/ (paths.py), which is not sent on.
"""

import httpx
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from serving import paths

HOP_HEADERS = ("content-type", "accept", "authorization")
# The gateway may hold a call to an endpoint at zero while it wakes, then wait for the replica's answer.
_client = httpx.Client(
    timeout=httpx.Timeout(settings.GATEWAY_WAKE_SECONDS + settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS + 5, connect=2.0)
)


def _error(status: int, code: str, message: str, details: dict | None = None) -> JsonResponse:
    return JsonResponse({"code": code, "message": message, "details": details or {}}, status=status)


def _raw_path(request, decoded_path: str) -> str:
    """The call's path after /v1/ as the caller encoded it: from the request target gunicorn keeps (RAW_URI), else
    (a server that hands over only the decoded path) the decoded path encoded again."""
    target = request.META.get("RAW_URI") or request.META.get("REQUEST_URI") or ""
    remainder = paths.raw_remainder(target)
    return remainder if remainder is not None else paths.encoded(decoded_path)


@csrf_exempt
def serve(request, slug: str, path: str):
    if not settings.GATEWAY_URL:
        return _error(503, "gateway_not_running", "No gateway is configured here (GATEWAY_URL); call the gateway.")
    try:
        checked = paths.replica_path(_raw_path(request, path))
    except paths.PathRefused as refused:
        return _error(refused.status_code, refused.code, refused.message, refused.details)
    headers = {name: request.headers[name] for name in HOP_HEADERS if name in request.headers}
    upstream = _client.build_request(
        request.method,
        f"{settings.GATEWAY_URL.rstrip('/')}/serve/{slug}/v1/{checked}",
        content=request.body,
        headers=headers,
        params=request.GET,
    )
    try:
        answer = _client.send(upstream, stream=True)
    except httpx.TransportError as error:
        return _error(502, "gateway_unavailable", f"The gateway did not answer: {type(error).__name__}")
    content_type = answer.headers.get("content-type", "application/json")
    if content_type.startswith("text/event-stream"):
        relayed = StreamingHttpResponse(_lines(answer), status=answer.status_code, content_type=content_type)
        relayed["Cache-Control"] = "no-cache"
    else:
        try:
            relayed = HttpResponse(answer.read(), status=answer.status_code, content_type=content_type)
        finally:
            answer.close()
    if "retry-after" in answer.headers:
        relayed["Retry-After"] = answer.headers["retry-after"]
    return relayed


def _lines(answer: httpx.Response):
    try:
        for line in answer.iter_lines():
            yield f"{line}\n".encode()
    except httpx.TransportError:
        pass
    finally:
        answer.close()
