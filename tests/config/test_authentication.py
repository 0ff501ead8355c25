"""Token authentication (config.authentication): the caller's user in one plain statement, refusals as DRF's."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from config.authentication import TokenAuthentication
from tenancy.models import ApiToken
from tests import factories

pytestmark = pytest.mark.django_db
PROJECTS = "/api/v1/projects/"


def test_a_token_signs_its_user_in_with_one_query_and_notes_its_use_once_a_minute(django_assert_num_queries):
    user = factories.UserFactory()
    secret = factories.token_for(user)
    stored = ApiToken.objects.get(user=user)
    ApiToken.objects.filter(pk=stored.pk).update(last_used_at=None)  # never used yet

    with django_assert_num_queries(2):  # the first use of the minute notes it
        TokenAuthentication().authenticate_credentials(secret)
    with django_assert_num_queries(1):
        found, token = TokenAuthentication().authenticate_credentials(secret)

    assert (found.pk, found.username, token.user, token.pk) == (user.pk, user.username, found, stored.pk)
    assert secret.startswith(f"cct_{token.prefix}_")
    noted = ApiToken.objects.get(pk=stored.pk).last_used_at
    assert noted is not None and timezone.now() - noted < timedelta(seconds=30)
    with time_machine.travel(timezone.now() + timedelta(minutes=2)), django_assert_num_queries(2):
        TokenAuthentication().authenticate_credentials(secret)


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("unknown", "authentication_failed", "Invalid token."),
        ("malformed", "authentication_failed", "Invalid token."),
        ("inactive", "authentication_failed", "User inactive or deleted."),
        ("revoked", "authentication_failed", "Invalid token."),
        ("expired", "token_expired", "This token has expired; sign in again for a new one."),
    ],
)
def test_an_unknown_revoked_or_expired_token_or_an_inactive_user_is_401_in_the_error_shape(api, case, code, message):
    user = factories.UserFactory()
    secret = factories.token_for(user)
    if case == "unknown":
        secret = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    elif case == "malformed":
        secret = "cct_\x00_x"
    elif case == "inactive":
        user.is_active = False
        user.save(update_fields=["is_active"])
    elif case == "revoked":
        user.api_tokens.update(revoked_at=timezone.now())
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")

    travel = timedelta(days=91) if case == "expired" else timedelta(0)
    with time_machine.travel(timezone.now() + travel):
        response = api.get(PROJECTS)

    assert response.status_code == 401
    assert (response.json()["code"], response.json()["message"]) == (code, message)
    assert response["WWW-Authenticate"] == "Token"
