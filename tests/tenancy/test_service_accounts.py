"""Service accounts: a lead creates one on the team page, issues it a scoped, expiring token shown once, revokes it;
the account is a member of its project only; every step is audited; others cannot."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tenancy.models import ApiToken, AuditEvent, GroupMapping, Membership, ServiceAccount
from tests import factories

pytestmark = pytest.mark.django_db


def team_url(project, tail=""):
    return f"/projects/{project.pk}/team/{tail}"


@pytest.fixture
def ci(client, roles):
    client.force_login(roles.lead)
    created = client.post(team_url(roles.project, "service-accounts/"), {"name": "nightly-ci", "description": "CI"})
    assert created.status_code == 302
    return ServiceAccount.objects.get(project=roles.project)


def test_a_lead_creates_a_service_account_and_issues_a_scoped_token_shown_once(api, client, roles, ci, settings):
    assert ci.user.username == f"svc-{roles.project.slug}-nightly-ci" and not ci.user.has_usable_password()
    assert list(Membership.objects.filter(user=ci.user).values_list("project", "role")) == [
        (roles.project.pk, "member")
    ]

    issued = client.post(
        team_url(roles.project, f"service-accounts/{ci.pk}/tokens/"),
        {"token_name": "GitLab", "scopes": ["catalog:read", "requests:read"], "expires_in_days": ""},
    )

    assert issued.status_code == 201 and issued["Cache-Control"] == "no-store"
    secret = re.search(r'<code id="issued-secret">([^<]+)</code>', issued.content.decode()).group(1)
    token = ApiToken.objects.get(user=ci.user)
    assert (token.scopes, token.project) == (["catalog:read", "requests:read"], roles.project)
    assert abs(token.expires_at - timezone.now() - timedelta(days=settings.API_TOKEN_DEFAULT_DAYS)) < timedelta(
        minutes=1
    )
    assert secret not in client.get(team_url(roles.project)).content.decode()  # shown once
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert api.get("/api/v1/catalog/services/").status_code == 200
    assert api.get("/api/v1/requests/").status_code == 200
    refused = api.post("/api/v1/requests/", {}, format="json")
    assert (refused.status_code, refused.json()["code"]) == (403, "token_scope")
    assert api.get(f"/api/v1/projects/{roles.other_project.pk}/").status_code == 403  # no projects:read at all

    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"service_account.created", "api_token.issued"} <= actions


def test_a_token_lives_at_most_the_operators_maximum_and_never_gets_operator_scopes(client, roles, ci, settings):
    settings.API_TOKEN_MAX_DAYS = 30
    too_long = client.post(
        team_url(roles.project, f"service-accounts/{ci.pk}/tokens/"),
        {"token_name": "GitLab", "scopes": ["catalog:read"], "expires_in_days": "31"},
    )
    assert too_long.status_code == 422 and "between 1 and 30 days" in too_long.content.decode()
    operator_scope = client.post(
        team_url(roles.project, f"service-accounts/{ci.pk}/tokens/"),
        {"token_name": "GitLab", "scopes": ["operations:write"]},
    )
    assert operator_scope.status_code == 422
    assert not ApiToken.objects.filter(user=ci.user).exists()


def test_revoking_a_token_and_switching_the_account_off_stop_it_at_once(api, client, roles, ci):
    secret = factories.token_for(ci.user, scopes=["catalog:read"], project=roles.project)
    token = ApiToken.objects.get(user=ci.user)
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert api.get("/api/v1/catalog/services/").status_code == 200

    client.post(team_url(roles.project, f"tokens/{token.pk}/revoke/"))
    assert api.get("/api/v1/catalog/services/").status_code == 401
    second = factories.token_for(ci.user, scopes=["catalog:read"], project=roles.project)
    client.post(team_url(roles.project, f"service-accounts/{ci.pk}/deactivate/"))
    api.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert api.get("/api/v1/catalog/services/").status_code == 401
    revoked = AuditEvent.objects.filter(action="api_token.revoked").values_list("actor", flat=True)
    assert list(revoked) == [roles.lead.pk, roles.lead.pk]


@pytest.mark.parametrize("who", ["developer", "approver", "other_developer", "outsider"])
def test_only_the_lead_and_operators_manage_service_accounts(client, roles, ci, who):
    client.force_login(getattr(roles, who))
    created = client.post(team_url(roles.project, "service-accounts/"), {"name": "sneaky"})
    issued = client.post(
        team_url(roles.project, f"service-accounts/{ci.pk}/tokens/"), {"token_name": "x", "scopes": ["catalog:read"]}
    )
    expected = 403 if who in ("developer", "approver") else 404
    assert (created.status_code, issued.status_code) == (expected, expected)
    assert ServiceAccount.objects.count() == 1 and not ApiToken.objects.filter(user=ci.user).exists()
    assert "issued-secret" not in client.get(team_url(roles.project)).content.decode()


def test_the_team_tab_tells_directory_places_from_manual_ones_and_leads_cannot_edit_directory_ones(client, roles):
    from tenancy.choices import GroupGrant
    from tenancy.directory.rights import directory_rights_apply

    person = factories.UserFactory(username="alice")
    GroupMapping.objects.create(
        group="research", grant=GroupGrant.PROJECT_MEMBER, project=roles.project, written_by=roles.operator
    )
    directory_rights_apply(user=person, groups=["research"], trigger="sync")
    client.force_login(roles.lead)

    page = client.get(team_url(roles.project)).content.decode()

    assert 'data-user="alice" data-role="member" data-source="directory"' in page
    assert "by directory group research" in page
    assert f'data-user="{roles.developer.username}" data-role="member" data-source="manual"' in page
    removed = client.post(team_url(roles.project, f"{person.pk}/remove/"), follow=True)
    assert "through the directory group research" in removed.content.decode()
    assert Membership.objects.filter(user=person, project=roles.project).exists()


def test_each_accounts_token_form_has_its_own_field_ids_and_shows_its_own_refusal(client, roles, ci):
    client.post(team_url(roles.project, "service-accounts/"), {"name": "deploy"})
    other = ServiceAccount.objects.get(user__username__endswith="-deploy")
    page = client.get(team_url(roles.project)).content.decode()
    assert f'id="id_svc{ci.pk}_token_name"' in page and f'id="id_svc{other.pk}_token_name"' in page
    assert 'id="id_token_name"' not in page

    refused = client.post(team_url(roles.project, f"service-accounts/{other.pk}/tokens/"), {"token_name": "x"})

    assert refused.status_code == 422
    body = refused.content.decode()
    card_of = {
        account: body.split(f'id="service-account-{account.user.username}"')[1].split('class="card"')[0]
        for account in (ci, other)
    }
    assert "This field is required." in card_of[other] and "This field is required." not in card_of[ci]


def test_a_service_account_never_becomes_an_approver(client, roles, ci):
    changed = client.post(team_url(roles.project, f"{ci.user.pk}/role/"), {"role": "approver"}, follow=True)

    assert "it never approves" in changed.content.decode()
    assert Membership.objects.get(user=ci.user, project=roles.project).role == "member"
