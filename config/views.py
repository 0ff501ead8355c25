"""Service-level endpoints: health, and the error pages: JSON for the API, the product's own pages for people
(in the demo too, which runs without DEBUG for that)."""

import logging
import sys

from django.db import connection
from django.http import HttpResponseServerError, JsonResponse
from django.middleware import csrf
from django.shortcuts import render
from django.template import loader
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django_q.brokers import get_broker

from config.database import connection_lost, unavailable_response
from config.errors import error_body
from config.session_end import page_to_return_to, session_ended, sign_in_url

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


def _said(exception) -> str:
    """The sentence a view raised its 404 or 403 with ("No such request."), or "" for Django's own (a URL that
    matches nothing carries the URLconf it tried, which a person should not see)."""
    message = exception.args[0] if exception is not None and exception.args else ""
    return message if isinstance(message, str) else ""


@csrf_exempt  # a POST to an unknown API path is a 404, not a CSRF refusal
def not_found(request, exception=None):
    if _wants_json(request):
        return JsonResponse(error_body("not_found", "No such endpoint or object."), status=404)
    return render(request, "404.html", {"reason": _said(exception)}, status=404)


def forbidden(request, exception=None):
    if _wants_json(request):
        return JsonResponse(error_body("permission_denied", _said(exception) or "Not allowed."), status=403)
    return render(request, "403.html", {"reason": _said(exception)}, status=403)


def server_failure(request):
    """The 500 handler, called while the exception is being handled: one that lost the database connection outside
    a view (a session saved by its middleware) is a 503 with Retry-After instead."""
    if connection_lost(sys.exc_info()[1]):
        return unavailable_response(request)
    if _wants_json(request):
        return JsonResponse(error_body("server_error", "An unexpected error occurred; it has been logged."), status=500)
    # Rendered without the request's context: what failed may be what a context processor reads (the database).
    return HttpResponseServerError(loader.get_template("500.html").render())


def csrf_failure(request, reason=""):
    """A form sent without the cookie this site set when the page was opened (cookies cleared or blocked, the
    session ended in the meantime), or from a page too old: say so and what to do, in the product's own words.
    The sign-in link returns to the page the form was on, where portal.js puts back what it held. A live part of a
    page (htmx) of a signed-out browser gets the same answer as for any of its requests once the session ended."""
    if request.headers.get("HX-Request") and not request.user.is_authenticated:
        return session_ended(request)
    back_to = page_to_return_to(request, request.headers.get("Referer"))
    context = {
        "signed_in": request.user.is_authenticated,
        "back_to": back_to,
        "sign_in_url": sign_in_url(back_to),
        "no_cookie": reason == csrf.REASON_NO_CSRF_COOKIE,
    }
    return render(request, "403_csrf.html", context, status=403)
