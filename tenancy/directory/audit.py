"""Every sign-in on the audit log: method (password, LDAP, the company IdP, the API's token endpoint), the client's
address, success or failure (the username tried, and why when known)."""

from django.contrib.auth import user_logged_in, user_login_failed
from django.db import transaction

from config.client_address import client_address
from tenancy.models import User
from tenancy.services import audit_record

METHODS = {
    "tenancy.sign_in_backends.LocalPasswordBackend": "password",
    "tenancy.directory.ldap.DirectoryLDAPBackend": "ldap",
    "tenancy.directory.oidc.OIDCBackend": "oidc",
}


def _where(request) -> str:
    path = request.path
    return "api" if path.startswith("/api/") else "console" if path.startswith("/admin/") else "portal"


def _over_http(request) -> bool:
    """A sign-in made over HTTP; not a test client's or a shell's login() without a client."""
    return request is not None and bool(request.META.get("REMOTE_ADDR"))


def record_sign_in(sender, request, user, **_kwargs) -> None:
    if not _over_http(request):
        return
    method = METHODS.get(getattr(user, "backend", ""), "other")
    with transaction.atomic():
        audit_record(
            actor=user,
            action="sign_in.succeeded",
            target=user,
            data={"method": method, "address": client_address(request), "via": _where(request)},
        )


def record_failure(sender, credentials, request=None, **_kwargs) -> None:
    if not _over_http(request):
        return
    username = str(credentials.get("username") or "")
    method = "password" if "username" in credentials else "oidc"
    target = User.objects.filter(username__iexact=username).first() if username else None
    with transaction.atomic():
        audit_record(
            actor=None,
            action="sign_in.failed",
            target=target,
            data={
                "method": method,
                "username": username[:150],
                "address": client_address(request),
                "via": _where(request),
                "reason": getattr(request, "sign_in_refusal", "") or "wrong credentials or locked out",
            },
        )


def connect() -> None:
    user_logged_in.connect(record_sign_in, dispatch_uid="tenancy.record_sign_in")
    user_login_failed.connect(record_failure, dispatch_uid="tenancy.record_sign_in_failure")
