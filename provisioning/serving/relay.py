"""/serve/<deployment>/v1/... reached on the web server: handed to the gateway data plane (GATEWAY_URL) unchanged.

The gateway (provisioning/serving/gateway.py, its own process) is the only data plane: it authenticates, limits,
routes and meters. In production the load balancer sends /serve/ to the gateways directly; this relay only keeps the
published URLs working on a single-address demo (`make run` sets GATEWAY_URL). It adds nothing and decides nothing.
"""

import httpx
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

HOP_HEADERS = ("content-type", "accept", "authorization")
_client = httpx.Client(timeout=httpx.Timeout(settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS + 5, connect=2.0))


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"code": code, "message": message, "details": {}}, status=status)


@csrf_exempt
def serve(request, slug: str, path: str):
    if not settings.GATEWAY_URL:
        return _error(503, "gateway_not_running", "No gateway is configured here (GATEWAY_URL); call the gateway.")
    headers = {name: request.headers[name] for name in HOP_HEADERS if name in request.headers}
    upstream = _client.build_request(
        request.method,
        f"{settings.GATEWAY_URL.rstrip('/')}/serve/{slug}/v1/{path}",
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
