"""/api/v1/projects/ and the token endpoint: who sees what, in which shape, and at what query cost."""

from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from tenancy import services
from tenancy.choices import QuotaDimension
from tenancy.models import ApiToken, AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db

PROJECTS = "/api/v1/projects/"
TOKEN = "/api/v1/auth/token/"
ERROR_KEYS = {"code", "message", "details"}
LIST_QUERY_BOUND = 8


def slugs(response) -> set[str]:
    assert response.status_code == 200, response.content
    return {row["slug"] for row in response.json()["results"]}


def test_anonymous_gets_401_in_the_error_shape(api, roles):
    response = api.get(PROJECTS)

    assert response.status_code == 401
    assert set(response.json()) == ERROR_KEYS
    assert response.json()["code"] == "not_authenticated"


def test_developer_sees_only_their_project(api_as, roles):
    assert slugs(api_as(roles.developer).get(PROJECTS)) == {roles.project.slug}


def test_developer_sees_member_role_and_six_quota_dimensions(api_as, roles):
    row = api_as(roles.developer).get(PROJECTS).json()["results"][0]

    assert row["my_role"] == "member"
    assert set(row["quota"]) == set(QuotaDimension.values)
    assert row["lead"] == roles.lead.username
    assert row["tenant"]["slug"] == roles.project.tenant.slug


@pytest.mark.parametrize(("who", "role"), [("approver", "approver"), ("lead", "lead")])
def test_approver_and_lead_see_their_own_role(api_as, roles, who, role):
    rows = api_as(getattr(roles, who)).get(PROJECTS).json()["results"]

    assert [(row["slug"], row["my_role"]) for row in rows] == [(roles.project.slug, role)]


def test_other_developer_sees_only_the_other_project(api_as, roles):
    assert slugs(api_as(roles.other_developer).get(PROJECTS)) == {roles.other_project.slug}


def test_outsider_sees_an_empty_list(api_as, roles):
    response = api_as(roles.outsider).get(PROJECTS)

    assert response.json()["count"] == 0
    assert slugs(response) == set()


def test_operator_sees_every_project_without_a_role(api_as, roles):
    response = api_as(roles.operator).get(PROJECTS)

    assert slugs(response) == {roles.project.slug, roles.other_project.slug}
    assert {row["my_role"] for row in response.json()["results"]} == {None}


def test_quota_limits_are_rendered_per_dimension(api_as, roles):
    limits = {"gpus": Decimal("2.5"), "cpu_cores": 32}
    services.quota_set(quota=roles.project.quota, limits=limits, actor=None)

    quota = api_as(roles.developer).get(f"{PROJECTS}{roles.project.pk}/").json()["quota"]

    assert quota["gpus"] == "2.50"
    assert quota["cpu_cores"] == 32
    assert quota["memory_gb"] is None


def test_detail_of_own_project(api_as, roles):
    response = api_as(roles.developer).get(f"{PROJECTS}{roles.project.pk}/")

    assert response.status_code == 200
    assert response.json()["slug"] == roles.project.slug


def test_detail_of_foreign_project_is_404_in_the_error_shape(api_as, roles):
    response = api_as(roles.developer).get(f"{PROJECTS}{roles.other_project.pk}/")

    assert response.status_code == 404
    assert set(response.json()) == ERROR_KEYS
    assert response.json()["code"] == "not_found"


def test_outsider_cannot_read_any_project_detail(api_as, roles):
    response = api_as(roles.outsider).get(f"{PROJECTS}{roles.project.pk}/")

    assert response.status_code == 404


def test_token_endpoint_returns_a_new_expiring_token_that_authenticates_and_is_stored_hashed(api, roles):
    response = api.post(TOKEN, {"username": roles.developer.username, "password": factories.PASSWORD})

    assert response.status_code == 200
    body = response.json()
    token = ApiToken.objects.get(user=roles.developer)
    assert body["token"].startswith(f"cct_{token.prefix}_") and body["prefix"] == token.prefix
    assert body["token"] not in (token.hashed, token.prefix) and len(token.hashed) == 64  # only the hash is kept
    lifetime = token.expires_at - token.created_at
    assert timedelta(days=89) < lifetime <= timedelta(days=90)
    assert datetime.fromisoformat(body["expires_at"]) == token.expires_at
    assert AuditEvent.objects.filter(action="api_token.issued", data__token=token.prefix).exists()
    api.credentials(HTTP_AUTHORIZATION=f"Token {body['token']}")
    assert slugs(api.get(PROJECTS)) == {roles.project.slug}


def test_token_endpoint_takes_a_name_and_a_lifetime_up_to_the_operators_maximum(api, roles, settings):
    settings.API_TOKEN_MAX_DAYS = 30
    asked = {"username": roles.developer.username, "password": factories.PASSWORD, "name": "laptop CLI"}

    refused = api.post(TOKEN, {**asked, "expires_in_days": 31})
    assert refused.status_code == 422
    assert refused.json()["code"] == "token_lifetime_out_of_range"
    assert refused.json()["details"] == {"field": "expires_in_days", "requested": 31, "maximum": 30}
    assert not ApiToken.objects.exists()

    assert api.post(TOKEN, {**asked, "expires_in_days": 7}).status_code == 200
    token = ApiToken.objects.get()
    assert token.name == "laptop CLI" and token.expires_at - token.created_at <= timedelta(days=7)


def test_token_endpoint_refuses_bad_credentials_with_validation_error(api, roles):
    response = api.post(TOKEN, {"username": roles.developer.username, "password": "wrong-password"})

    assert response.status_code == 400
    assert set(response.json()) == ERROR_KEYS
    assert response.json()["code"] == "validation_error"
    assert "token" not in response.json()


def test_tenant_quota_is_null_when_the_tenant_has_none(api_as, roles):
    row = api_as(roles.developer).get(PROJECTS).json()["results"][0]

    assert row["tenant_quota"] is None


def test_tenant_quota_is_a_dict_of_limits_when_the_tenant_has_one(api_as, roles):
    quota = services.tenant_quota_ensure(tenant=roles.project.tenant, actor=None)
    services.quota_set(quota=quota, limits={"gpus": Decimal("16")}, actor=None)

    row = api_as(roles.developer).get(PROJECTS).json()["results"][0]

    assert set(row["tenant_quota"]) == set(QuotaDimension.values)
    assert row["tenant_quota"]["gpus"] == "16.00"


def _list_query_count(client, assert_max_queries) -> int:
    with assert_max_queries(LIST_QUERY_BOUND) as queries:
        response = client.get(PROJECTS)
    assert response.status_code == 200
    return len(queries)


def _add_projects_with_member(user, count: int) -> None:
    for _ in range(count):
        project = factories.project()
        services.tenant_quota_ensure(tenant=project.tenant, actor=None)
        factories.member(project, user=user)


def test_project_list_query_count_does_not_grow_with_projects(api_as, roles, django_assert_max_num_queries):
    client = api_as(roles.developer)
    _add_projects_with_member(roles.developer, 2)
    client.get(PROJECTS)  # warm per-process caches (content types) before measuring

    with_three = _list_query_count(client, django_assert_max_num_queries)
    _add_projects_with_member(roles.developer, 9)
    response = client.get(PROJECTS)
    with_twelve = _list_query_count(client, django_assert_max_num_queries)

    assert response.json()["count"] == 12
    assert with_three == with_twelve
