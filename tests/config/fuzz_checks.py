"""schemathesis checks for the fuzz test (tests/config/test_fuzz.py), loaded by the schemathesis CLI in its own
virtualenv through SCHEMATHESIS_HOOKS: never imported by the suite itself."""

import json

import schemathesis

ERROR_KEYS = {"code", "message", "details"}
# The device sign-in's token endpoint also answers in OAuth's own words where OAuth defines the refusal (RFC 6749
# 5.2, RFC 8628 3.5), which OAuth clients read: those refusals carry `error` and `error_description` beside ours.
OAUTH_PATH, OAUTH_KEYS = "/api/v1/auth/device/token/", {"error", "error_description"}


def _shapes(path: str) -> list[set]:
    return [ERROR_KEYS, ERROR_KEYS | OAUTH_KEYS] if path == OAUTH_PATH else [ERROR_KEYS]


@schemathesis.check
def error_body_shape(ctx, response, case):
    """Every refusal is a JSON object of exactly {code, message, details} (plus OAuth's two keys on the device token
    endpoint), with a string code and message."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} body is not JSON: {response.content[:200]!r}") from None
    if not (
        isinstance(body, dict)
        and set(body) in _shapes(case.path)
        and isinstance(body["code"], str)
        and isinstance(body["message"], str)
    ):
        raise AssertionError(
            f"{response.status_code} body is not {{code, message, details}}: {response.content[:300]!r}"
        )
    return None
