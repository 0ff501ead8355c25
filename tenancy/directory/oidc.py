"""OpenID Connect sign-in (authorization code flow with PKCE): the relying party's protocol steps.

mozilla-django-oidc runs the browser side (tenancy.directory.views subclasses its views): the authorization request
with state, nonce and an S256 PKCE challenge kept in the session, the callback's checks, RP-initiated logout. Its
backend module imports the PyPI `requests` package at import time, which our `requests` app shadows
(docs/architecture.md), so the back channel is ours, with httpx and PyJWT (which mozilla-django-oidc itself uses):
the token exchange with the PKCE verifier, the ID token's signature, issuer, audience, expiry and nonce, the
userinfo call, and the refresh the periodic sync makes. Settings keep mozilla-django-oidc's names (OIDC_RP_*,
OIDC_OP_*), read from the environment in config/settings.py.
"""

import logging
import time
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import jwt
from django.conf import settings
from django.contrib.auth.backends import BaseBackend
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from tenancy.choices import DirectorySource
from tenancy.directory import secrets
from tenancy.directory.accounts import SignInRefused, account_for_sign_in
from tenancy.directory.rights import directory_rights_apply
from tenancy.models import User

logger = logging.getLogger(__name__)
SESSION_ID_TOKEN = "oidc_id_token"


class ProviderUnavailable(Exception):
    """The IdP did not answer (down, restarting, unreachable): nothing can be concluded about anyone."""


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    end_session_endpoint: str


_discovered: dict[str, tuple[float, dict]] = {}


def _discovery() -> dict:
    """The IdP's discovery document (OIDC_OP_DISCOVERY_URL), kept for OIDC_DISCOVERY_CACHE_SECONDS."""
    url = settings.OIDC_OP_DISCOVERY_URL
    if not url:
        return {}
    kept = _discovered.get(url)
    if kept and kept[0] > time.monotonic():
        return kept[1]
    try:
        with _http() as client:
            document = client.get(url).raise_for_status().json()
    except httpx.HTTPError as failure:
        raise ProviderUnavailable(f"The IdP's discovery document did not load: {failure}") from failure
    _discovered[url] = (time.monotonic() + settings.OIDC_DISCOVERY_CACHE_SECONDS, document)
    return document


def provider() -> Provider:
    """The IdP's endpoints: each explicit OIDC_OP_* setting, else the discovery document's."""
    explicit = {
        "issuer": settings.OIDC_OP_ISSUER,
        "authorization_endpoint": settings.OIDC_OP_AUTHORIZATION_ENDPOINT,
        "token_endpoint": settings.OIDC_OP_TOKEN_ENDPOINT,
        "userinfo_endpoint": settings.OIDC_OP_USER_ENDPOINT,
        "jwks_uri": settings.OIDC_OP_JWKS_ENDPOINT,
        "end_session_endpoint": settings.OIDC_OP_LOGOUT_ENDPOINT,
    }
    discovered = _discovery() if not all(explicit.values()) else {}
    return Provider(**{name: value or discovered.get(name, "") for name, value in explicit.items()})


def _http() -> httpx.Client:
    return httpx.Client(timeout=settings.OIDC_TIMEOUT_SECONDS, verify=settings.OIDC_VERIFY_TLS)


def _token_call(form: dict) -> dict:
    """POST to the token endpoint with the client's credentials; the JSON answer. ProviderUnavailable when the IdP
    does not answer; TokenRefusedByProvider when it answers no (e.g. invalid_grant)."""
    client_id, secret = settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET
    if settings.OIDC_TOKEN_AUTH_METHOD == "client_secret_post":
        form, auth = {**form, "client_id": client_id, "client_secret": secret}, None
    else:  # client_secret_basic, which every IdP takes (RFC 6749 2.3.1: each part form-encoded first)
        form, auth = (
            {**form, "client_id": client_id},
            httpx.BasicAuth(quote(client_id, safe=""), quote(secret, safe="")),
        )
    try:
        with _http() as client:
            response = client.post(provider().token_endpoint, data=form, auth=auth)
    except httpx.HTTPError as failure:
        raise ProviderUnavailable(f"The IdP's token endpoint did not answer: {failure}") from failure
    if response.status_code >= 500:
        raise ProviderUnavailable(f"The IdP's token endpoint answered {response.status_code}.")
    body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if response.status_code != 200:
        raise TokenRefusedByProvider(body.get("error") or f"http_{response.status_code}")
    return body


class TokenRefusedByProvider(Exception):
    def __init__(self, error: str):
        super().__init__(error)
        self.error = error


def _signing_key(header: dict):
    """The key that signed an ID token: OIDC_RP_IDP_SIGN_KEY when set (IdPs whose tokens name no key, `kid`), else
    the IdP's published key the token names."""
    if settings.OIDC_RP_IDP_SIGN_KEY:
        return settings.OIDC_RP_IDP_SIGN_KEY
    kid = header.get("kid")
    if not kid:
        raise SignInRefused("id_token_unverifiable", "The IdP's ID token names no key; set OIDC_IDP_SIGN_KEY_FILE.")
    try:
        with _http() as client:
            keys = client.get(provider().jwks_uri).raise_for_status().json().get("keys", [])
    except httpx.HTTPError as failure:
        raise ProviderUnavailable(f"The IdP's keys did not load: {failure}") from failure
    match = next((key for key in keys if key.get("kid") == kid), None)
    if match is None:
        raise SignInRefused("id_token_unverifiable", "The IdP's ID token names a key it does not publish.")
    return jwt.PyJWK(match)


def verified_claims(id_token: str, *, nonce: str | None) -> dict:
    """The ID token's claims once its signature, algorithm, issuer, audience, expiry and nonce hold."""
    try:
        header = jwt.get_unverified_header(id_token)
        if header.get("alg") != settings.OIDC_RP_SIGN_ALGO:
            raise SignInRefused("id_token_unverifiable", f"The ID token is signed with {header.get('alg')!r}.")
        claims = jwt.decode(
            id_token,
            _signing_key(header),
            algorithms=[settings.OIDC_RP_SIGN_ALGO],
            audience=settings.OIDC_RP_CLIENT_ID,
            issuer=provider().issuer or None,
            leeway=settings.OIDC_CLOCK_LEEWAY_SECONDS,
            options={"require": ["exp", "iat", "sub"], "verify_iss": bool(provider().issuer)},
        )
    except jwt.PyJWTError as invalid:
        raise SignInRefused("id_token_invalid", f"The IdP's ID token did not verify: {invalid}.") from invalid
    if nonce is not None and claims.get("nonce") != nonce:
        raise SignInRefused("id_token_invalid", "The ID token's nonce is not this sign-in's.")
    return claims


def _userinfo(access_token: str, subject: str) -> dict:
    """The userinfo endpoint's claims about the same subject (some IdPs put groups only there); {} without one."""
    endpoint = provider().userinfo_endpoint
    if not endpoint or not access_token:
        return {}
    try:
        with _http() as client:
            response = client.get(endpoint, headers={"Authorization": f"Bearer {access_token}"})
    except httpx.HTTPError as failure:
        raise ProviderUnavailable(f"The IdP's userinfo endpoint did not answer: {failure}") from failure
    if response.status_code != 200:
        return {}
    claims = response.json()
    return claims if claims.get("sub") == subject else {}


def groups_of(claims: dict) -> list[str]:
    value = claims.get(settings.OIDC_CLAIM_GROUPS, [])
    if isinstance(value, str):
        value = [value]
    return sorted({str(group) for group in value if str(group)})


class OIDCBackend(BaseBackend):
    """Authenticates the callback of an authorization code flow (mozilla-django-oidc's callback view calls
    `authenticate(request, nonce=..., code_verifier=...)`). It grants no permissions of its own: users' rights are
    the model backend's and guardian's, as for everyone."""

    def authenticate(self, request, nonce=None, code_verifier=None):
        if request is None or not settings.OIDC_ENABLED:
            return None
        code = request.GET.get("code")
        if not code or not request.GET.get("state"):
            return None
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": request.build_absolute_uri(reverse("oidc_authentication_callback")),
        }
        if code_verifier:
            form["code_verifier"] = code_verifier
        try:
            tokens = _token_call(form)
            claims = verified_claims(tokens.get("id_token", ""), nonce=nonce)
            claims = {**claims, **_userinfo(tokens.get("access_token", ""), claims["sub"])}
            user = self._signed_in(claims, tokens.get("refresh_token", ""))
        except (SignInRefused, ProviderUnavailable, TokenRefusedByProvider) as refused:
            request.sign_in_refusal = str(refused)
            logger.warning("OIDC sign-in refused: %s", refused)
            return None
        request.session[SESSION_ID_TOKEN] = tokens.get("id_token", "")
        return user

    @transaction.atomic
    def _signed_in(self, claims: dict, refresh_token: str) -> User:
        account = account_for_sign_in(
            source=DirectorySource.OIDC,
            subject=claims["sub"],
            username=str(claims.get(settings.OIDC_CLAIM_USERNAME) or claims.get("email") or claims["sub"]),
            email=str(claims.get(settings.OIDC_CLAIM_EMAIL) or ""),
            first_name=str(claims.get(settings.OIDC_CLAIM_FIRST_NAME) or ""),
            last_name=str(claims.get(settings.OIDC_CLAIM_LAST_NAME) or ""),
            groups=groups_of(claims),
        )
        if refresh_token:
            account.refresh_token = secrets.sealed(refresh_token)
            account.save(update_fields=["refresh_token"])
        directory_rights_apply(user=account.user, groups=account.groups, trigger="sign_in")
        return account.user

    def get_user(self, user_id):
        user = User.objects.filter(pk=user_id).first()
        return user if user is not None and user.is_active else None


def current_groups(account) -> list[str] | None:
    """The person's groups as the IdP says now, by refreshing their grant (the sync): the refreshed ID token's and
    userinfo's group claim. None when the IdP ended the grant (the person left, or signed out everywhere): their
    directory rights lapse until they sign in again. The claims of the last sign-in when there is no refresh token.
    ProviderUnavailable when the IdP does not answer (then nothing changes)."""
    refresh_token = secrets.opened(account.refresh_token)
    if not refresh_token:
        return list(account.groups)
    try:
        tokens = _token_call({"grant_type": "refresh_token", "refresh_token": refresh_token})
    except TokenRefusedByProvider:
        return None
    claims = {"sub": account.subject}
    if tokens.get("id_token"):
        try:
            claims.update(verified_claims(tokens["id_token"], nonce=None))
        except SignInRefused:
            return None
    claims.update(_userinfo(tokens.get("access_token", ""), account.subject))
    if tokens.get("refresh_token"):
        account.refresh_token = secrets.sealed(tokens["refresh_token"])
    account.groups_read_at = timezone.now()
    return groups_of(claims)


def logout_url(request) -> str:
    """OIDC_OP_LOGOUT_URL_METHOD: where signing out leads: the IdP's end-session endpoint (RP-initiated logout, with
    the ID token as hint and this site's sign-in page to come back to) when the IdP has one and the person signed
    in with it; else this site's sign-in page."""
    local = request.build_absolute_uri(reverse("login"))
    id_token = request.session.get(SESSION_ID_TOKEN)
    try:
        endpoint = provider().end_session_endpoint if id_token else ""
    except ProviderUnavailable:
        endpoint = ""
    if not endpoint:
        return reverse("login")
    query = httpx.QueryParams(
        {"id_token_hint": id_token, "post_logout_redirect_uri": local, "client_id": settings.OIDC_RP_CLIENT_ID}
    )
    return f"{endpoint}?{query}"
