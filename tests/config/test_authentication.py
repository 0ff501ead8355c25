"""Token authentication (config.authentication): the caller's user in one plain statement, refusals as DRF's."""

import pytest

from config.authentication import TokenAuthentication
from tests import factories

pytestmark = pytest.mark.django_db
PROJECTS = "/api/v1/projects/"


def test_a_token_signs_its_user_in_with_one_query(django_assert_num_queries):
    user = factories.UserFactory()
    key = factories.token_for(user)

    with django_assert_num_queries(1):
        found, token = TokenAuthentication().authenticate_credentials(key)

    assert (found.pk, found.username, token.key, token.user) == (user.pk, user.username, key, found)


@pytest.mark.parametrize(
    ("case", "message"), [("unknown", "Invalid token."), ("inactive", "User inactive or deleted.")]
)
def test_an_unknown_token_or_an_inactive_user_is_401_in_the_error_shape(api, case, message):
    user = factories.UserFactory()
    key = factories.token_for(user)
    if case == "unknown":
        key = key[::-1]
    else:
        user.is_active = False
        user.save(update_fields=["is_active"])
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")

    response = api.get(PROJECTS)

    assert response.status_code == 401
    assert (response.json()["code"], response.json()["message"]) == ("authentication_failed", message)
    assert response["WWW-Authenticate"] == "Token"
