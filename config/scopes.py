"""Which token scope each API endpoint needs (tenancy.choices.TokenScope), decided in one place.

A view may name its scope (`token_scope`: a scope, or {HTTP method: scope}); otherwise the app the view belongs to
and whether the call only reads decide, from `APP_SCOPES`. Session callers (the portal's own calls) are not scoped:
scopes narrow what a token may do, never what its holder may. tests/config/test_scopes.py holds every API route to
having a scope.
"""

from rest_framework import exceptions

from tenancy.choices import TokenScope

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# app label of the view's module -> (scope for reads, scope for writes)
APP_SCOPES: dict[str, tuple[str, str]] = {
    "catalog": (TokenScope.CATALOG_READ, TokenScope.OPERATIONS_WRITE),
    "tenancy": (TokenScope.PROJECTS_READ, TokenScope.OPERATIONS_WRITE),
    "requests": (TokenScope.REQUESTS_READ, TokenScope.REQUESTS_WRITE),
    "provisioning": (TokenScope.REQUESTS_READ, TokenScope.OPERATIONS_WRITE),
    "serving": (TokenScope.REQUESTS_READ, TokenScope.OPERATIONS_WRITE),
    "scheduling": (TokenScope.INVENTORY_READ, TokenScope.OPERATIONS_WRITE),
    "metering": (TokenScope.USAGE_READ, TokenScope.OPERATIONS_WRITE),
}


class TokenScopeMissing(exceptions.PermissionDenied):
    """403 `token_scope`: the token may not make this call; `details` names the scope it lacks."""

    default_code = "token_scope"

    def __init__(self, *, missing: str, granted: list[str]):
        super().__init__(
            f"This token lacks the scope {missing} ({TokenScope(missing).label.lower()}); issue one that has it.",
            code=self.default_code,
        )
        self.details = {"missing_scope": missing, "token_scopes": granted}


def required_scope(view_class: type, method: str) -> str | None:
    """The scope a call of `view_class` with `method` needs; None for a view outside every app (no token reaches
    one: the schema and docs are public, the token endpoint signs in)."""
    declared = getattr(view_class, "token_scope", None)
    if isinstance(declared, dict):
        declared = declared.get(method.upper()) or declared.get("*")
    if declared:
        return declared
    scopes = APP_SCOPES.get(view_class.__module__.split(".", 1)[0])
    if scopes is None:
        return None
    return scopes[0] if method.upper() in READ_METHODS else scopes[1]


def check_token_scope(request, token) -> None:
    """Refuse the call when the token's scopes do not hold the one the resolved view needs."""
    match = getattr(request._request, "resolver_match", None)
    view_class = getattr(getattr(match, "func", None), "cls", None)
    if view_class is None:
        return
    needed = required_scope(view_class, request.method)
    if needed is not None and needed not in token.scopes:
        raise TokenScopeMissing(missing=needed, granted=list(token.scopes))
