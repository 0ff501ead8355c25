"""`cc login` on a server with company sign-in: the OAuth 2.0 device authorization grant (RFC 8628), with this
platform as the authorization server for its own personal API tokens.

The CLI asks for a sign-in (`device_authorization_start`) and gets a device code, which it keeps and polls with, and a
user code, which the person types on /device/ while signed in on the portal (OIDC, LDAP or a password: however the
server signs people in). The person sees what the CLI asks for (scopes, token lifetime, from which address) and
approves or denies; the CLI's next poll (`device_token_exchange`) gets a personal token issued by `api_token_issue`,
so it is scoped, expiring and audited as a token made on the API tokens page. Both codes are stored only as SHA-256
hashes and work once; polling faster than the interval is answered slow_down (the interval grows by
SLOW_DOWN_SECONDS, RFC 8628 3.5), and the endpoints are throttled per client address
(config.throttling.DeviceSignInThrottle).
"""

import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from config.errors import DomainError, NotFound, NotPermitted
from config.tokens import secret_hash
from tenancy.api_tokens import IssuedApiToken, api_token_issue, checked_scopes, token_lifetime
from tenancy.choices import PERSONAL_DEFAULT_SCOPES, DeviceAuthorizationState, TokenScope
from tenancy.models import DeviceAuthorization, User
from tenancy.services import audit_record

# RFC 8628 6.1: consonants only (no vowels, so no words; no look-alikes such as 0/O, 1/I), 8 of them (20^8 codes).
USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LENGTH = 8
SLOW_DOWN_SECONDS = 5  # RFC 8628 3.5: what each slow_down adds to the interval for every later poll
DEVICE_GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"
VERIFICATION_PATH = "/device/"


def company_sign_in_on() -> bool:
    """The device flow is for servers whose people sign in with the company's identity (OIDC or LDAP), where no
    password exists to give `cc login`; elsewhere `cc login` takes a token made on the API tokens page."""
    return bool(settings.OIDC_ENABLED or settings.LDAP_ENABLED)


@dataclass(frozen=True)
class StartedDeviceAuthorization:
    authorization: DeviceAuthorization
    device_code: str  # for the CLI only, never stored
    user_code: str  # for the person, shown as XXXX-XXXX, never stored


class DeviceGrantRefused(DomainError):
    """A poll of the token endpoint that gets no token; `code` is RFC 8628's error (authorization_pending,
    slow_down, access_denied, expired_token) or RFC 6749's invalid_grant (unknown or used device code)."""

    status_code = 400


def user_code_normalised(typed: str) -> str:
    """What the person typed, as it was issued: upper case, without the dash, spaces or other separators."""
    return "".join(character for character in (typed or "").upper() if character.isalnum())


def user_code_shown(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


@transaction.atomic
def device_authorization_start(
    *, token_name: str, scopes: list[str] | None, expires_in_days: int | None, address: str | None
) -> StartedDeviceAuthorization:
    """A new device sign-in asking for a token named `token_name` with `scopes` (the page's default ones when None)
    living `expires_in_days` (the platform's default when None); refused where company sign-in is off."""
    if not company_sign_in_on():
        raise NotFound(
            "This server has no company sign-in: make a token on the API tokens page and give it to `cc login`.",
            code="device_flow_off",
            details={"tokens_page": "/account/api-tokens/"},
        )
    scopes = checked_scopes(scopes, allowed=TokenScope.values) if scopes is not None else PERSONAL_DEFAULT_SCOPES
    days = token_lifetime(expires_in_days).days
    device_code, user_code = secrets.token_urlsafe(32), _user_code_new()
    authorization = DeviceAuthorization.objects.create(
        device_code_hash=secret_hash(device_code),
        user_code_hash=secret_hash(user_code),
        token_name=(token_name or "").strip()[:80] or "cc",
        scopes=list(scopes),
        token_days=days,
        requested_from=address,
        expires_at=timezone.now() + timedelta(seconds=settings.DEVICE_CODE_LIFETIME_SECONDS),
        interval_seconds=settings.DEVICE_POLL_INTERVAL_SECONDS,
    )
    return StartedDeviceAuthorization(authorization, device_code, user_code)


def _user_code_new() -> str:
    return "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))


def device_authorization_for_user_code(*, typed: str, person: User) -> DeviceAuthorization:
    """The waiting sign-in whose user code the person typed. Wrong codes count per person, and past
    DEVICE_USER_CODE_ATTEMPTS in DEVICE_USER_CODE_WINDOW_SECONDS every code is refused for the rest of the window
    (so nobody signed in can walk the code space looking for another person's waiting CLI)."""
    attempts_key = f"device-user-code-attempts:{person.pk}"
    if cache.get(attempts_key, 0) >= settings.DEVICE_USER_CODE_ATTEMPTS:
        raise NotPermitted(
            "Too many wrong codes; wait a few minutes, then type the code your terminal shows.",
            code="user_code_attempts",
            details={"window_seconds": settings.DEVICE_USER_CODE_WINDOW_SECONDS},
        )
    code = user_code_normalised(typed)
    found = DeviceAuthorization.objects.filter(
        user_code_hash=secret_hash(code), state=DeviceAuthorizationState.PENDING, expires_at__gt=timezone.now()
    ).first()
    if found is None:
        cache.add(attempts_key, 0, settings.DEVICE_USER_CODE_WINDOW_SECONDS)
        cache.incr(attempts_key)
        raise NotFound(
            "No terminal is waiting for this code: check it, or run `cc login` again (a code works 10 minutes, once).",
            code="user_code_unknown",
            details={"field": "user_code"},
        )
    return found


@transaction.atomic
def device_authorization_decide(
    *, authorization: DeviceAuthorization, approve: bool, actor: User
) -> DeviceAuthorization:
    """The signed-in person approves (the CLI's next poll gets a token acting as them) or denies the sign-in. A
    service account never signs in on the portal, so it never approves one."""
    if hasattr(actor, "service_account") or not actor.is_active:
        raise NotPermitted("A service account cannot sign a terminal in.", code="service_account_device")
    authorization = DeviceAuthorization.objects.select_for_update().get(pk=authorization.pk)
    if authorization.state != DeviceAuthorizationState.PENDING or authorization.expires_at <= timezone.now():
        raise DomainError(
            "This code was answered already or has expired; run `cc login` again.",
            code="device_code_answered",
            details={"state": authorization.state},
        )
    decide = authorization.approve if approve else authorization.deny
    decide(by=actor, at=timezone.now())
    authorization.save(update_fields=["state", "decided_by", "decided_at"])
    audit_record(
        actor=actor,
        action="device_sign_in.approved" if approve else "device_sign_in.denied",
        target=actor,
        data={
            "token_name": authorization.token_name,
            "scopes": authorization.scopes,
            "token_days": authorization.token_days,
            "requested_from": authorization.requested_from,
        },
    )
    return authorization


def device_token_exchange(*, device_code: str) -> IssuedApiToken:
    """The CLI's poll: the token once the person approved (the device code then works no more), else the RFC's
    error as DeviceGrantRefused. Every poll is noted, so one that comes before the interval has passed is answered
    slow_down."""
    outcome = _poll(device_code)
    if isinstance(outcome, DeviceGrantRefused):
        raise outcome
    return outcome


@transaction.atomic
def _poll(device_code: str) -> IssuedApiToken | DeviceGrantRefused:
    """Returns its refusal rather than raising it, so what the poll noted (its time, a slower interval) is kept."""
    authorization = (
        DeviceAuthorization.objects.select_for_update(of=("self",))
        .filter(device_code_hash=secret_hash(device_code or ""))
        .select_related("decided_by")
        .first()
    )
    if authorization is None or authorization.state == DeviceAuthorizationState.USED:
        return DeviceGrantRefused("Unknown or already used device code; run `cc login` again.", code="invalid_grant")
    now = timezone.now()
    if authorization.expires_at <= now:
        return DeviceGrantRefused(
            "The code expired before it was approved; run `cc login` again.", code="expired_token"
        )
    if authorization.state == DeviceAuthorizationState.DENIED:
        return DeviceGrantRefused("The sign-in was denied on the portal.", code="access_denied")
    too_soon = authorization.last_polled_at is not None and now - authorization.last_polled_at < timedelta(
        seconds=authorization.interval_seconds
    )
    authorization.last_polled_at = now
    if too_soon:
        authorization.interval_seconds += SLOW_DOWN_SECONDS
        authorization.save(update_fields=["last_polled_at", "interval_seconds"])
        return _refusal_with_interval(authorization, "slow_down", "Polling too fast: wait {interval} s between polls.")
    if authorization.state == DeviceAuthorizationState.PENDING:
        authorization.save(update_fields=["last_polled_at"])
        return _refusal_with_interval(
            authorization, "authorization_pending", "Waiting for the code to be approved on the portal."
        )
    return _token_for(authorization)


def _refusal_with_interval(authorization: DeviceAuthorization, code: str, sentence: str) -> DeviceGrantRefused:
    interval = authorization.interval_seconds
    return DeviceGrantRefused(sentence.format(interval=interval), code=code, details={"interval": interval})


def _token_for(authorization: DeviceAuthorization) -> IssuedApiToken:
    person = authorization.decided_by
    issued = api_token_issue(
        user=person,
        name=authorization.token_name,
        actor=person,
        expires_in_days=authorization.token_days,
        scopes=authorization.scopes,
    )
    authorization.use(token=issued.token)
    authorization.save(update_fields=["state", "token", "last_polled_at"])
    return issued


def device_authorizations_purge() -> int:
    """Delete device sign-ins whose codes expired a day ago: their decision and token are on the audit log."""
    deleted, _ = DeviceAuthorization.objects.filter(expires_at__lt=timezone.now() - timedelta(days=1)).delete()
    return deleted
