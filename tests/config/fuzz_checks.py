"""schemathesis checks for the fuzz test (tests/config/test_fuzz.py), loaded by the schemathesis CLI in its own
virtualenv through SCHEMATHESIS_HOOKS: never imported by the suite itself."""

import json

import schemathesis

ERROR_KEYS = {"code", "message", "details"}


@schemathesis.check
def error_body_shape(ctx, response, case):
    """Every refusal is a JSON object of exactly {code, message, details}, with a string code and message."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} body is not JSON: {response.content[:200]!r}") from None
    if not (
        isinstance(body, dict)
        and set(body) == ERROR_KEYS
        and isinstance(body["code"], str)
        and isinstance(body["message"], str)
    ):
        raise AssertionError(
            f"{response.status_code} body is not {{code, message, details}}: {response.content[:300]!r}"
        )
    return None
