"""A lost database connection (the server restarted, a proxy or an operator closed it, the network dropped) is answered
503 with Retry-After, in the API's error shape on the API: never a bare 500. A read is first tried once more on a
fresh connection (config.middleware.DatabaseConnectionLossMiddleware): reading again changes nothing. A write is not
repeated: whether the lost connection had committed it is not known here, and the client decides.

Django's CONN_HEALTH_CHECKS catches a connection that died between two requests; these catch one that dies during a
request, before its first query or between two.
"""

from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponse, JsonResponse

from config.errors import error_body

RETRY_AFTER_SECONDS = 2  # a dropped connection is usually back at once; a restarting server takes a few seconds
CONNECTION_LOST = "database_connection_lost"  # the attribute that marks such an answer for the middleware's retry
UNAVAILABLE_CODE = "database_unavailable"
UNAVAILABLE_MESSAGE = "The database connection was lost while answering; try again in a few seconds."


def connection_lost(error: BaseException | None) -> bool:
    """A database error that left a connection unusable, as opposed to a refusal on a live one (a constraint, a
    lock timeout): the latter stays a 4xx or 500 of its own."""
    return isinstance(error, DatabaseError) and any(
        not connection.is_usable() for connection in connections.all(initialized_only=True)
    )


def unavailable_body() -> dict:
    return error_body(UNAVAILABLE_CODE, UNAVAILABLE_MESSAGE, {"retry_after_seconds": RETRY_AFTER_SECONDS})


def mark_connection_lost(response: HttpResponse) -> HttpResponse:
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    setattr(response, CONNECTION_LOST, True)
    return response


def unavailable_response(request: HttpRequest) -> HttpResponse:
    """The 503 for a request whose connection was lost: the error shape on the API, a sentence on pages."""
    if request.path.startswith("/api/"):
        response = JsonResponse(unavailable_body(), status=503)
    else:
        response = HttpResponse(UNAVAILABLE_MESSAGE, status=503, content_type="text/plain; charset=utf-8")
    return mark_connection_lost(response)


def drop_lost_connections() -> None:
    """Close the connections that no longer answer, so the next query opens a fresh one. A connection inside a
    transaction block is left to it (closing it would hide the failure from the block's own rollback)."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block and not connection.is_usable():
            connection.close()
