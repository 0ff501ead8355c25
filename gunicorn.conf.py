"""gunicorn settings, read from the working directory by every `gunicorn config.wsgi ...` (README, benchmarks).

gunicorn refuses some requests itself, before the app sees them: a request line or header over its limits, a
malformed request. Those answers come in the API's error shape too, not as gunicorn's HTML page. The request line
may be as long as gunicorn allows (8190 bytes) so that a long query string reaches the app, whose limit
(REQUEST_MAX_QUERY_STRING_LENGTH) answers it with a JSON 414 saying what the limit is.
"""

import gc
import json

from gunicorn import util

limit_request_line = 8190

_CODES = {414: "request_line_too_long"}


def _write_json_error(sock, status_int: int, reason: str, mesg: str) -> None:
    body = json.dumps(
        {"code": _CODES.get(status_int, "bad_request"), "message": f"{reason}: {mesg}", "details": {}}
    ).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    util.write_nonblock(sock, head + body)


util.write_error = _write_json_error  # the one place gunicorn's workers write their own error answers


# A worker's long-lived objects (modules, URL patterns, serializer fields, the kept catalog and rules, the last cycle's
# picture) are built by its first calls. The cyclic collector's full passes walked all of them again every few
# hundred calls: 60-80 ms in the middle of whichever request triggered one. Frozen once the worker is warm, they are
# left out of those passes; what they hold stays alive either way.
FREEZE_AFTER_REQUESTS = 200


def post_request(worker, req, environ, resp):
    if worker.nr == FREEZE_AFTER_REQUESTS:
        gc.freeze()
