"""`cc login` on a server with company sign-in: the OAuth 2.0 device authorization grant (RFC 8628) served by the
platform for its own personal API tokens (tenancy/device_flow.py). The API's answers (pending, slow_down, denial,
expiry, reuse), the /device/ page, the role matrix, and the whole flow with a real OIDC sign-in and the real CLI."""

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from django.utils import timezone

from tenancy.choices import PERSONAL_DEFAULT_SCOPES, GroupGrant, Role
from tenancy.device_flow import DEVICE_GRANT_TYPE
from tenancy.models import ApiToken, AuditEvent, DeviceAuthorization
from tenancy.service_accounts import service_account_create
from tests import factories
from tests.tenancy.test_directory import mapping, oidc_sign_in

pytestmark = pytest.mark.django_db
CHECKOUT = Path(__file__).resolve().parents[2]
DEVICE, TOKEN, PROJECTS = "/api/v1/auth/device/", "/api/v1/auth/device/token/", "/api/v1/projects/"


@pytest.fixture
def company_sign_in(settings):
    """Company sign-in switched on (the device flow's condition); who approves signs in with force_login here, and
    through the real IdP in the end-to-end test."""
    settings.OIDC_ENABLED = True
    settings.DEVICE_POLL_INTERVAL_SECONDS = 5
    return settings


def _start(api, **asked) -> dict:
    started = api.post(DEVICE, asked, format="json")
    assert started.status_code == 200, started.content
    return started.json()


def _poll(api, device_code: str):
    return api.post(TOKEN, {"grant_type": DEVICE_GRANT_TYPE, "device_code": device_code}, format="json")


def _poll_later(api, device_code: str):
    """A poll after the interval has passed (the last poll moved back in time instead of waiting)."""
    DeviceAuthorization.objects.update(last_polled_at=timezone.now() - timedelta(minutes=5))
    return _poll(api, device_code)


def _answer(client, user_code: str, decision: str):
    return client.post("/device/", {"user_code": user_code, "decision": decision})


def test_without_company_sign_in_the_device_flow_is_off_and_cc_login_takes_a_token(api, settings):
    settings.OIDC_ENABLED = settings.LDAP_ENABLED = False
    refused = api.post(DEVICE, {}, format="json")
    assert refused.status_code == 404 and refused.json()["code"] == "device_flow_off"
    assert not DeviceAuthorization.objects.exists()


def test_pending_then_slow_down_then_approved_gives_one_token_once(api, client, company_sign_in, roles):
    started = _start(api, client_id="cc", name="cc on laptop", scope="requests:read projects:read", expires_in_days=7)
    assert re.fullmatch(r"[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}", started["user_code"])
    assert started["verification_uri"] == "http://testserver/device/"
    assert started["verification_uri_complete"] == f"http://testserver/device/?user_code={started['user_code']}"
    assert (started["interval"], started["expires_in"]) == (5, 600)
    stored = DeviceAuthorization.objects.get()
    assert started["device_code"] not in str(stored.__dict__) and started["user_code"][:4] not in stored.user_code_hash

    pending = _poll(api, started["device_code"])
    assert pending.status_code == 400
    assert pending.json()["error"] == pending.json()["code"] == "authorization_pending"
    too_fast = _poll(api, started["device_code"])
    assert too_fast.json()["error"] == "slow_down" and too_fast.json()["details"] == {"interval": 10}
    assert _poll(api, started["device_code"]).json()["details"] == {"interval": 15}  # each slow_down adds 5 s

    client.force_login(roles.developer)
    shown = client.get("/device/", {"user_code": started["user_code"].lower().replace("-", " ")})
    page = shown.content.decode()
    assert shown.status_code == 200 and "cc on laptop" in page and "7 days after you approve" in page
    assert (
        "<code>requests:read</code>" in page and "<code>projects:read</code>" in page and "requests:write" not in page
    )
    assert "Approved" in _answer(client, started["user_code"], "approve").content.decode()

    granted = _poll_later(api, started["device_code"])
    assert granted.status_code == 200, granted.content
    body = granted.json()
    assert body["token_type"] == "Token" and body["access_token"] == body["token"]
    assert (body["scope"], body["name"]) == ("projects:read requests:read", "cc on laptop")
    assert body["expires_in"] == 7 * 86400 and granted["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(prefix=body["prefix"])
    assert (token.user, token.scopes, token.project) == (roles.developer, ["projects:read", "requests:read"], None)
    api.credentials(HTTP_AUTHORIZATION=f"Token {body['access_token']}")
    assert [row["id"] for row in api.get(PROJECTS).json()["results"]] == [roles.project.pk]
    api.credentials()

    reused = _poll_later(api, started["device_code"])
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"
    assert ApiToken.objects.filter(user=roles.developer).count() == 1
    said = AuditEvent.objects.filter(action__in=["device_sign_in.approved", "api_token.issued"]).order_by("id")
    assert list(said.values_list("action", flat=True)) == [
        "device_sign_in.approved",
        "api_token.issued",
    ]
    again = client.get("/device/", {"user_code": started["user_code"]})  # a code works once
    assert again.status_code == 404 and "No terminal is waiting for this code" in again.content.decode()


def test_a_denied_sign_in_gets_access_denied_and_no_token(api, client, company_sign_in, roles):
    started = _start(api)
    client.force_login(roles.developer)
    assert "Denied" in _answer(client, started["user_code"], "deny").content.decode()

    denied = _poll(api, started["device_code"])
    assert denied.status_code == 400 and denied.json()["error"] == "access_denied"
    assert not ApiToken.objects.exists()
    assert AuditEvent.objects.get(action__startswith="device_sign_in").action == "device_sign_in.denied"
    late = _answer(client, started["user_code"], "approve")  # answered already: the code is no longer waiting
    assert late.status_code == 404 and not ApiToken.objects.exists()


def test_an_expired_code_gets_expired_token_and_cannot_be_approved(api, client, company_sign_in, roles):
    started = _start(api)
    DeviceAuthorization.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    assert _poll(api, started["device_code"]).json()["error"] == "expired_token"
    client.force_login(roles.developer)
    assert _answer(client, started["user_code"], "approve").status_code == 404
    assert _poll(api, "not-a-device-code").json()["error"] == "invalid_grant"
    wrong_grant = api.post(TOKEN, {"grant_type": "password", "device_code": started["device_code"]}, format="json")
    assert wrong_grant.json()["error"] == "unsupported_grant_type"
    missing = api.post(TOKEN, {}, format="json")  # RFC 6749 5.2: invalid_request, in both vocabularies
    assert missing.status_code == 400 and missing.json()["error"] == "invalid_request"
    assert missing.json()["code"] == "invalid_request" and set(missing.json()["details"]) == {
        "grant_type",
        "device_code",
    }


def test_the_token_follows_the_pages_rules_for_scopes_and_lifetime(api, company_sign_in, settings):
    assert _start(api)["interval"] == 5
    assert DeviceAuthorization.objects.get().scopes == PERSONAL_DEFAULT_SCOPES
    unknown = api.post(DEVICE, {"scope": "requests:read root"}, format="json")
    assert unknown.status_code == 422 and unknown.json()["code"] == "invalid_scope"
    too_long = api.post(DEVICE, {"expires_in_days": settings.API_TOKEN_MAX_DAYS + 1}, format="json")
    assert too_long.status_code == 422 and too_long.json()["code"] == "token_lifetime_out_of_range"


def test_wrong_codes_on_the_page_are_counted_per_person(client, company_sign_in, roles, settings):
    settings.DEVICE_USER_CODE_ATTEMPTS = 3
    client.force_login(roles.outsider)
    for _ in range(3):
        assert client.get("/device/", {"user_code": "BCDF-GHJK"}).status_code == 404
    blocked = client.get("/device/", {"user_code": "BCDF-GHJK"})
    assert blocked.status_code == 403 and "Too many wrong codes" in blocked.content.decode()


def test_the_page_asks_who_is_signed_in_first(client, company_sign_in):
    landed = client.get("/device/", {"user_code": "BCDF-GHJK"})
    assert landed.status_code == 302 and landed["Location"].startswith("/accounts/login/?next=/device/")


@pytest.mark.parametrize(
    ("role", "sees"),
    [("developer", "project"), ("approver", "project"), ("lead", "project"), ("outsider", None)],
)
def test_role_matrix_the_token_acts_with_the_approvers_own_rights(api, client, company_sign_in, roles, role, sees):
    started = _start(api, scope="projects:read requests:write")
    client.force_login(getattr(roles, role))
    _answer(client, started["user_code"], "approve")
    secret = _poll(api, started["device_code"]).json()["access_token"]

    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    seen = [row["id"] for row in api.get(PROJECTS).json()["results"]]
    assert seen == ([getattr(roles, sees).pk] if sees else [])
    assert api.get("/api/v1/requests/").json()["code"] == "token_scope"  # within the scopes approved only


def test_role_matrix_an_operator_sees_every_project_and_a_service_account_cannot_approve(
    api, client, company_sign_in, roles
):
    started = _start(api, scope="projects:read")
    client.force_login(roles.operator)
    _answer(client, started["user_code"], "approve")
    api.credentials(HTTP_AUTHORIZATION=f"Token {_poll(api, started['device_code']).json()['access_token']}")
    assert {row["id"] for row in api.get(PROJECTS).json()["results"]} >= {roles.project.pk, roles.other_project.pk}

    api.credentials()
    robot = service_account_create(project=roles.project, name="ci", description="", actor=roles.lead)
    started = _start(api)
    client.force_login(robot.user)
    refused = _answer(client, started["user_code"], "approve")
    assert refused.status_code == 403 and DeviceAuthorization.objects.filter(state="pending").count() == 1


@pytest.mark.integration
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_cc_login_through_the_real_oidc_sign_in_from_start_to_a_working_token(
    client, idp, live_server, company_sign_in, tmp_path
):
    """The real CLI as a process against the live server: it prints the portal's address and a code and polls;
    the person signs in through the IdP (the authorization code flow with PKCE), follows the link, approves; the
    CLI keeps the token and uses it."""
    company_sign_in.DEVICE_POLL_INTERVAL_SECONDS = 1
    research = factories.project(slug="research", name="Research")
    mapping("research", GroupGrant.PROJECT_MEMBER, project=research)
    # The checkout's CLI, whatever the environment has installed.
    environment = {**os.environ, "CC_CONFIG": str(tmp_path / "config.json"), "PYTHONPATH": str(CHECKOUT / "cli")}
    environment.pop("CC_TOKEN", None)
    command = [sys.executable, "-m", "computecatalog_cli", "--server", live_server.url, "login", "--json"]
    cli = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        shown = cli.stderr.readline() + cli.stderr.readline()
        link = re.search(r"\(or open (\S+)\);", shown).group(1)
        user_code = re.search(r"enter the code (\S+)", shown).group(1)
        assert link == f"{live_server.url}/device/?user_code={user_code}"

        device_path = link.removeprefix(live_server.url)
        assert client.get(device_path)["Location"] == f"/accounts/login/?next={quote(device_path, safe='/')}"
        landed = oidc_sign_in(client, idp, "alice", next_path=device_path)
        assert landed["Location"] == device_path  # back on the code's page after signing in at the IdP
        assert "A terminal asks to act as <strong>alice</strong>" in client.get(device_path).content.decode()
        _answer(client, user_code, "approve")

        stdout, stderr = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 0, stderr
    assert '"projects": [\n    "research"\n  ]' in stdout
    token = ApiToken.objects.get(user__username="alice")
    assert token.name.startswith("cc on ") and token.scopes == PERSONAL_DEFAULT_SCOPES
    assert Path(environment["CC_CONFIG"]).stat().st_mode & 0o077 == 0
    assert AuditEvent.objects.filter(action="device_sign_in.approved", actor__username="alice").exists()
    assert research.memberships.get(user=token.user).role == Role.MEMBER
