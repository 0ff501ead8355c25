"""/metrics in the Prometheus text format. Apps register collectors (read the database at scrape time) in ready().

Scrapers send `Authorization: Bearer <METRICS_TOKEN>`. Outside the demo (DEMO or DEBUG) the token is required
(settings refuse to load without it, and an empty one here answers 401 to everyone); in the demo an empty token leaves
/metrics open.
"""

import hmac

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

_collectors: list = []


def register(collector) -> None:
    """Add a prometheus_client collector (an object with collect() yielding metric families)."""
    if collector not in _collectors:
        _collectors.append(collector)


def _authorised(request) -> bool:
    token = settings.METRICS_TOKEN
    if not token:
        return settings.DEMO or settings.DEBUG
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given, token)


@never_cache
def metrics(request):
    if not _authorised(request):
        return HttpResponse("metrics token required\n", status=401, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    for collector in _collectors:
        registry.register(collector)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
