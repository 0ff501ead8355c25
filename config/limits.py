"""Bounds on free-form JSON objects (order parameters), shared by the API and the portal form."""

import json

# Ids are bigint columns: a larger number can name nothing, so it is refused before any query.
BIGINT_MAX = 2**63 - 1


def object_bounds_problem(value: dict, *, max_keys: int, max_key_length: int, max_bytes: int) -> str | None:
    """The first bound the object breaks, as a sentence; None when it is within all of them."""
    if len(value) > max_keys:
        return f"At most {max_keys} keys (got {len(value)})."
    longest = max((len(str(key)) for key in value), default=0)
    if longest > max_key_length:
        return f"Keys may be at most {max_key_length} characters (got one of {longest})."
    size = len(json.dumps(value, ensure_ascii=False, default=str).encode())
    if size > max_bytes:
        return f"At most {max_bytes} bytes as JSON (got {size})."
    return None
