"""A person's API tokens page (/account/api-tokens/, for `cc login`): the role matrix, the secret shown once to its
owner only, revocation by the owner only, a constant number of queries."""

import pytest
from django.urls import reverse

from tenancy.api_tokens import api_token_issue
from tenancy.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db
PAGE = "/account/api-tokens/"
PROJECTS = "/api/v1/projects/"
ROLES = ("developer", "other_developer", "approver", "lead", "operator")


def test_anonymous_callers_are_sent_to_sign_in(client, roles):
    assert client.get(PAGE).status_code == 302
    token = api_token_issue(user=roles.developer, name="laptop", actor=roles.developer).token
    assert client.post(reverse("team:api-token-revoke", args=[token.pk])).status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


def test_everyone_sees_their_own_working_tokens_only(client, roles, django_assert_max_num_queries):
    names = {role: f"laptop number {number}" for number, role in enumerate(ROLES)}
    for role, name in names.items():
        api_token_issue(user=getattr(roles, role), name=name, actor=getattr(roles, role))
        api_token_issue(user=getattr(roles, role), name=f"{name} again", actor=getattr(roles, role))
    # A token bound to a project is a service account's: its lead's team page shows it, not a person's page.
    api_token_issue(
        user=roles.developer, name="bound", actor=roles.lead, project=roles.project, scopes=["catalog:read"]
    )
    for role in ROLES:
        client.force_login(getattr(roles, role))
        with django_assert_max_num_queries(12):
            page = client.get(PAGE)
        body = page.content.decode()
        assert page.status_code == 200, role
        assert names[role] in body and f"{names[role]} again" in body, role
        assert all(names[other] not in body for other in ROLES if other != role), role
        assert "bound" not in body, role


def test_a_token_made_on_the_page_is_shown_once_works_within_its_scopes_and_is_audited(client, api, roles):
    client.force_login(roles.developer)
    made = client.post(
        PAGE, {"token_name": "cc on my laptop", "scopes": ["requests:read", "catalog:read"], "expires_in_days": 7}
    )
    assert made.status_code == 201 and made["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(user=roles.developer, name="cc on my laptop")
    secret = made.context["issued"].secret
    assert f'<code id="issued-secret">{secret}</code>' in made.content.decode()
    assert token.scopes == ["catalog:read", "requests:read"] and token.project is None
    assert round((token.expires_at - token.created_at).total_seconds() / 86400) == 7
    assert secret not in client.get(PAGE).content.decode()  # once: never again, not on the list
    assert AuditEvent.objects.get(action="api_token.issued").data["token"] == token.prefix
    assert secret not in str(AuditEvent.objects.values_list("data", flat=True))

    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert api.get("/api/v1/requests/").status_code == 200
    refused = api.get(PROJECTS)
    assert refused.status_code == 403 and refused.json()["code"] == "token_scope"


def test_refused_input_is_a_422_with_the_form_kept(client, roles, settings):
    client.force_login(roles.developer)
    too_long = client.post(
        PAGE, {"token_name": "x", "scopes": ["catalog:read"], "expires_in_days": settings.API_TOKEN_MAX_DAYS + 1}
    )
    assert too_long.status_code == 422 and "A token lives between 1 and" in too_long.content.decode()
    unscoped = client.post(PAGE, {"token_name": "x"})
    assert unscoped.status_code == 422
    assert not ApiToken.objects.filter(user=roles.developer).exists()


def test_only_the_owner_revokes_a_token_and_it_stops_at_once(client, api, roles):
    issued = api_token_issue(user=roles.developer, name="laptop", actor=roles.developer)
    revoke = reverse("team:api-token-revoke", args=[issued.token.pk])
    for role in ("other_developer", "approver", "lead", "operator"):  # the admin is the operators' place for it
        client.force_login(getattr(roles, role))
        assert client.post(revoke).status_code == 404, role
    bound = api_token_issue(
        user=roles.developer, name="b", actor=roles.lead, project=roles.project, scopes=["catalog:read"]
    )
    client.force_login(roles.developer)  # a project-bound token is revoked on its project's team page, not here
    assert client.post(reverse("team:api-token-revoke", args=[bound.token.pk])).status_code == 404
    assert ApiToken.objects.get(pk=issued.token.pk).revoked_at is None

    client.force_login(roles.developer)
    assert client.post(revoke).status_code == 302
    api.credentials(HTTP_AUTHORIZATION=f"Token {issued.secret}")
    assert api.get(PROJECTS).status_code == 401
    assert f'data-token="{issued.token.prefix}"' not in client.get(PAGE).content.decode()
    assert client.post(revoke).status_code == 302  # a second revoke says so, and changes nothing
    assert client.post(f"{PAGE}{2**64}/revoke/").status_code == 404
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1
