"""Which paths of /serve/<deployment>/v1/<path> reach a replica: <path> goes to the replica under its own /v1/, so
it may hold nothing that a server on the way would read as another place. The gateway (gateway.py) and the web
server's relay (relay.py) check a call with this one rule before anything else, and forward the path as checked.

Refused: `.` and `..` segments (however encoded), empty segments (`//`), an encoded `/`, `\\`, `.` or `%` (`%2f`,
`%5c`, `%2e`, `%25`: a server that decodes once more would see a separator, a dot segment or another escape), a
backslash, and control characters. The OpenAI-compatible API the replicas serve has no path that needs any of them.
"""

import re
from urllib.parse import quote, unquote

from config.errors import BadRequest

REFUSED_ESCAPES = re.compile(r"%(2f|5c|2e|25)", re.IGNORECASE)
CONTROL_OR_BACKSLASH = re.compile(r"[\x00-\x1f\x7f\\]")
# The part of a raw request target after /serve/<deployment>/v1/, without its query.
RAW_REMAINDER = re.compile(r"^/serve/[^/?#]+/v1/(?P<path>[^?#]*)")
SAFE_IN_PATH = "/:@!$&'()*+,;=-._~"  # what stays as it is when a decoded path is encoded again (RFC 3986 pchar)


class PathRefused(BadRequest):
    code = "invalid_path"


def replica_path(raw: str) -> str:
    """The <path> to send to the replica under /v1/: `raw`, the caller's own percent-encoding of it, when it stays
    there; PathRefused (400 invalid_path) naming why not."""
    if REFUSED_ESCAPES.search(raw):
        _refuse(raw, "an encoded '/', '\\', '.' or '%'")
    decoded = unquote(raw)
    if CONTROL_OR_BACKSLASH.search(decoded):
        _refuse(raw, "a backslash or a control character")
    segments = decoded.split("/")
    if any(segment in (".", "..") for segment in segments):
        _refuse(raw, "a '.' or '..' segment")
    if "" in segments[:-1]:  # a trailing slash is a path of its own; an empty segment inside is not
        _refuse(raw, "an empty segment ('//')")
    return raw


def raw_remainder(raw_target: str) -> str | None:
    """<path> of a raw request target `/serve/<deployment>/v1/<path>[?query]`, still percent-encoded; None when the
    target is not of that form."""
    found = RAW_REMAINDER.match(raw_target)
    return found["path"] if found else None


def encoded(decoded_path: str) -> str:
    """A decoded path encoded again, for a server that hands over only the decoded one."""
    return quote(decoded_path, safe=SAFE_IN_PATH)


def _refuse(raw: str, what: str) -> None:
    shown = raw if len(raw) <= 200 else raw[:200] + "…"
    raise PathRefused(
        f"The path after /v1/ holds {what}; it must stay under the deployment's /v1/.", details={"path": shown}
    )
