"""Password guessing is bounded (django-axes, config.signin, config.throttling): per account and per client address,
on the sign-in page and on POST /api/v1/auth/token/, a rotated X-Forwarded-For does not help unless a trusted proxy
wrote it, operators see and clear lockouts in the console (audited), and every throttle counts the same client."""

from datetime import timedelta

import pytest
import time_machine
from axes.models import AccessAttempt, AccessFailureLog
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.utils import timezone

from tenancy.models import ApiToken, AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db

TOKEN = "/api/v1/auth/token/"
SIGN_IN = "/accounts/login/"
ATTEMPTS = "/admin/axes/accessattempt/"


def _token(api, username: str, password: str, forwarded: str | None = None):
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}
    return api.post(TOKEN, {"username": username, "password": password}, **extra)


def test_25_wrong_passwords_then_the_right_one_is_refused_on_the_token_endpoint(api, roles):
    statuses = [_token(api, roles.developer.username, f"guess-{n}").status_code for n in range(25)]

    assert statuses[:9] == [400] * 9  # the first failures are plain wrong passwords
    assert set(statuses[9:]) == {429}  # the tenth locks the account out
    right = _token(api, roles.developer.username, factories.PASSWORD)
    assert right.status_code == 429
    assert right.json()["code"] == "sign_in_locked"
    assert right.json()["details"] == {"failure_limit": 10, "retry_after_seconds": 1800}
    assert right["Retry-After"] == "1800"
    assert not ApiToken.objects.exists()
    assert AccessFailureLog.objects.filter(username=roles.developer.username, locked_out=True).exists()


def test_25_wrong_passwords_then_the_right_one_is_refused_on_the_sign_in_page(client, roles):
    for n in range(25):
        page = client.post(SIGN_IN, {"username": roles.developer.username, "password": f"guess-{n}"})
        assert page.status_code == (200 if n < 9 else 429), n

    page = client.post(SIGN_IN, {"username": roles.developer.username, "password": factories.PASSWORD})

    assert page.status_code == 429
    assert "Too many failed sign-ins" in page.content.decode() and 'id="locked-out"' in page.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_lockout_lifts_after_the_cool_off(api, roles):
    for n in range(10):
        _token(api, roles.developer.username, f"guess-{n}")
    assert _token(api, roles.developer.username, factories.PASSWORD).status_code == 429

    with time_machine.travel(timezone.now() + timedelta(minutes=31)):
        assert _token(api, roles.developer.username, factories.PASSWORD).status_code == 200


def _spray(api, forwarded_for) -> list[int]:
    """Ten wrong passwords, each for another account, each with another X-Forwarded-For."""
    return [_token(api, f"someone-{n}", "Winter2026!", forwarded_for(n)).status_code for n in range(10)]


def test_a_rotated_x_forwarded_for_is_one_client_unless_the_proxy_is_trusted(api, roles):
    assert _spray(api, lambda n: f"203.0.113.{n}")[-1] == 429  # the address is locked out after ten

    refused = _token(api, roles.developer.username, factories.PASSWORD, forwarded="198.51.100.77")

    assert refused.status_code == 429 and refused.json()["code"] == "sign_in_locked"
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"127.0.0.1"}


def test_behind_a_trusted_proxy_each_forwarded_client_counts_on_its_own(api, roles, settings):
    settings.TRUSTED_PROXY_CIDRS = ["127.0.0.0/8"]
    assert _spray(api, lambda n: f"203.0.113.{n}") == [400] * 10

    assert _token(api, roles.developer.username, factories.PASSWORD, forwarded="198.51.100.77").status_code == 200
    assert AccessAttempt.objects.filter(ip_address="127.0.0.1").count() == 0


def test_an_operator_sees_and_clears_a_lockout_with_a_reason_on_the_audit_record(api, client, roles):
    client.force_login(roles.approver)
    assert client.get(ATTEMPTS).status_code == 302  # developers never reach the console
    for n in range(10):
        _token(api, roles.developer.username, f"guess-{n}")
    attempt = AccessAttempt.objects.get(username=roles.developer.username)
    client.force_login(roles.operator)
    listing = client.get(ATTEMPTS)
    assert listing.status_code == 200 and roles.developer.username in listing.content.decode()
    assert "delete_selected" not in listing.content.decode()  # clearing leaves a trace; plain deletion is not offered
    chosen = {"action": "clear_sign_in_lockouts", ACTION_CHECKBOX_NAME: [attempt.pk]}
    confirm = client.post(ATTEMPTS, chosen)
    assert confirm.status_code == 200 and AccessAttempt.objects.exists()  # asks for the reason first
    client.post(ATTEMPTS, {**chosen, "apply": "1", "reason": "called the service desk; verified by phone"})

    assert not AccessAttempt.objects.exists()
    audit = AuditEvent.objects.get(action="sign_in_lockout.cleared")
    assert (audit.actor, audit.reason) == (roles.operator, "called the service desk; verified by phone")
    assert audit.data == {"username": roles.developer.username, "ip_address": "127.0.0.1", "failures": 10}
    assert _token(api, roles.developer.username, factories.PASSWORD).status_code == 200


def test_the_token_endpoint_is_throttled_per_client_address(api, roles, settings):
    settings.API_THROTTLE_SIGN_IN_RATE = "3/min"
    statuses = [_token(api, "nobody", "x", forwarded=f"203.0.113.{n}").status_code for n in range(4)]

    assert statuses == [400, 400, 400, 429]


def test_signed_in_api_use_is_throttled_per_user(api_as, roles, settings):
    settings.API_THROTTLE_USER_RATE = "3/min"
    developer = api_as(roles.developer)
    assert [developer.get("/api/v1/projects/").status_code for _ in range(3)] == [200] * 3

    throttled = developer.get("/api/v1/projects/")

    assert throttled.status_code == 429
    assert throttled.json()["code"] == "throttled"
    assert 0 < throttled.json()["details"]["retry_after_seconds"] <= 60
    assert api_as(roles.approver).get("/api/v1/projects/").status_code == 200  # someone else is not held up


def test_the_installer_endpoints_throttle_a_rotated_x_forwarded_for_as_one_client(api, settings):
    settings.API_THROTTLE_INSTALLER_RATE = "20/min"
    statuses = [
        api.get("/api/v1/provisioning/pxe/boot.ipxe", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}").status_code
        for n in range(25)
    ]

    assert statuses[:20] == [404] * 20 and statuses[20:] == [429] * 5
