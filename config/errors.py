"""Domain errors: what a service raises when it refuses, carried to clients as {code, message, details}."""

from typing import Any


def error_body(code: str, message: str, details=None) -> dict:
    """The one error shape of the API and the JSON error pages."""
    return {"code": code, "message": message, "details": details if details is not None else {}}


class DomainError(Exception):
    """A refusal with a machine-readable code, a human sentence and the numbers involved."""

    status_code = 422
    code = "invalid_request"

    def __init__(self, message: str, *, code: str | None = None, details: Any = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.details = details if details is not None else {}


class NotPermitted(DomainError):
    status_code = 403
    code = "permission_denied"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class BadRequest(DomainError):
    """Input that no endpoint can take: malformed, too deep, or holding what the database cannot store."""

    status_code = 400
    code = "bad_request"


class PayloadTooLarge(DomainError):
    status_code = 413
    code = "request_too_large"
