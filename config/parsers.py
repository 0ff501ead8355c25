"""The API's JSON parser: DRF's, plus the limits that keep any accepted body storable and bounded.

Refused with a 400 before a view runs: nesting deeper than API_JSON_MAX_DEPTH (Python's decoder would otherwise
exhaust the interpreter's recursion limit and answer 500), NUL characters in strings or keys (PostgreSQL text and
jsonb cannot store them), and NaN, Infinity or numbers beyond a double (jsonb cannot store them either).
"""

import codecs
import json
import math

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from config.errors import BadRequest


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NotFinite(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"{text[:40]} is out of range for a number")
    return value


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        max_depth = settings.API_JSON_MAX_DEPTH
        try:
            data = json.load(
                codecs.getreader(encoding)(stream), parse_constant=_refuse_constant, parse_float=_finite_float
            )
        except RecursionError:
            raise _too_deep(max_depth, path="") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        check_storable(data, max_depth=max_depth)
        return data


def _too_deep(max_depth: int, path: str) -> BadRequest:
    return BadRequest(
        f"JSON may nest at most {max_depth} levels deep.",
        code="json_too_deep",
        details={"max_depth": max_depth, "path": path},
    )


def check_storable(data, *, max_depth: int) -> None:
    """Walk the parsed document without recursion: depth within max_depth, no NUL in any string or key."""
    pending = [(data, 1, "")]
    while pending:
        value, depth, path = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise nul_character_error(path)
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > max_depth:
            raise _too_deep(max_depth, path)
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if isinstance(key, str) and "\x00" in key:
                raise nul_character_error(path)
            pending.append((item, depth + 1, f"{path}.{key}" if path else str(key)))


def nul_character_error(path: str) -> BadRequest:
    return BadRequest("Text may not contain NUL (\\u0000) characters.", code="nul_character", details={"path": path})
