"""Service-level endpoints: health and JSON error pages for the API."""

import logging
import sys

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import page_not_found, server_error
from django_q.brokers import get_broker

from config.api import error_body
from config.database import connection_lost, unavailable_response

logger = logging.getLogger(__name__)


def _check_database() -> dict:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "unreachable" to a health probe
        logger.warning("Health check: database unreachable: %s", exc)
        return {"ok": False, "vendor": connection.vendor, "error": exc.__class__.__name__}
    return {"ok": True, "vendor": connection.vendor}


def _check_queue() -> dict:
    broker = get_broker()
    try:
        reachable = bool(broker.ping())
        depth = broker.queue_size()
    except Exception as exc:  # a broker that cannot answer is down, whatever the exception
        logger.warning("Health check: queue broker unreachable: %s", exc)
        return {"ok": False, "broker": broker.info(), "error": exc.__class__.__name__}
    return {"ok": reachable, "broker": broker.info(), "queued_tasks": depth}


@never_cache
def healthz(request):
    checks = {"database": _check_database(), "queue": _check_queue()}
    healthy = all(check["ok"] for check in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks}, status=200 if healthy else 503
    )


def _wants_json(request) -> bool:
    return request.path.startswith("/api/")


@csrf_exempt  # a POST to an unknown API path is a 404, not a CSRF refusal
def not_found(request, exception=None):
    if _wants_json(request):
        return JsonResponse(error_body("not_found", "No such endpoint or object."), status=404)
    return page_not_found(request, exception)


def server_failure(request):
    """The 500 handler, called while the exception is being handled: one that lost the database connection outside
    a view (a session saved by its middleware) is a 503 with Retry-After instead."""
    if connection_lost(sys.exc_info()[1]):
        return unavailable_response(request)
    if _wants_json(request):
        return JsonResponse(error_body("server_error", "An unexpected error occurred; it has been logged."), status=500)
    return server_error(request)
