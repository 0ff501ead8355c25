"""Size limits on every request, checked before anything reads it (settings REQUEST_MAX_BODY_BYTES and
REQUEST_MAX_QUERY_STRING_LENGTH), answered in the API's error shape; a lost database connection retried once for a
read and otherwise answered 503 with Retry-After (config/database.py).

The body limit is decided from Content-Length, and an over-limit body is then read and thrown away before the
413 goes out: gunicorn drains at most 64 KiB of an unread body before it reuses a keep-alive connection and
closes it otherwise, so an agent posting 10 MB would lose its connection (and, while still sending, possibly the
answer). Bodies beyond REQUEST_DRAIN_MAX_BYTES are not read: for those the connection closes.
"""

from django.conf import settings
from django.http import JsonResponse

from config import database
from config.errors import error_body

READS = frozenset({"GET", "HEAD", "OPTIONS"})


def _content_length(request) -> int:
    try:
        return max(int(request.META.get("CONTENT_LENGTH") or 0), 0)
    except ValueError:
        return 0  # as Django's own request reads it


def _discard_body(request, length: int) -> None:
    if length <= settings.REQUEST_DRAIN_MAX_BYTES:
        while request.read(64 * 1024):
            pass


def _body_too_large(request) -> JsonResponse | None:
    limit, length = settings.REQUEST_MAX_BODY_BYTES, _content_length(request)
    if length <= limit:
        return None
    _discard_body(request, length)
    return JsonResponse(
        error_body(
            "request_too_large",
            f"The request body may be at most {limit} bytes.",
            {"limit_bytes": limit, "content_length": length},
        ),
        status=413,
    )


def _query_too_long(request) -> JsonResponse | None:
    limit, length = settings.REQUEST_MAX_QUERY_STRING_LENGTH, len(request.META.get("QUERY_STRING", ""))
    if length <= limit:
        return None
    return JsonResponse(
        error_body(
            "query_string_too_long",
            f"The query string may be at most {limit} characters.",
            {"limit": limit, "length": length},
        ),
        status=414,
    )


class RequestLimitsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return _query_too_long(request) or _body_too_large(request) or self.get_response(request)


class DatabaseConnectionLossMiddleware:
    """A request whose database connection was lost is answered 503 with Retry-After (the API in its error shape, by
    config.api.exception_handler; a page's view by process_exception; anything else by the 500 handler), and a read is
    first run once more on a fresh connection. Outermost but for the security headers and the size limits, so the
    second run goes through sessions and authentication again."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if getattr(response, database.CONNECTION_LOST, False):
            database.drop_lost_connections()
            if request.method in READS:
                response = self.get_response(request)
                database.drop_lost_connections()
        return response

    def process_exception(self, request, exception):
        return database.unavailable_response(request) if database.connection_lost(exception) else None
