"""Operators clear sign-in lockouts (django-axes' AccessAttempt rows, config.signin), audited."""

from axes.models import AccessAttempt
from django.db import transaction

from config.errors import DomainError
from tenancy.models import User
from tenancy.services import audit_record


@transaction.atomic
def sign_in_lockout_clear(*, attempt: AccessAttempt, reason: str, actor: User) -> None:
    """Forget the failures counted for this account and address: the next sign-in is checked as any other."""
    reason = (reason or "").strip()
    if not reason:
        raise DomainError("Give a reason; it goes on the audit record.", code="reason_required")
    audit_record(
        actor=actor,
        action="sign_in_lockout.cleared",
        target=attempt,
        reason=reason,
        data={
            "username": attempt.username,
            "ip_address": attempt.ip_address,
            "failures": attempt.failures_since_start,
        },
    )
    attempt.delete()
