"""API keys through the API and the pages, by role; the operator console for deployments and keys."""

import pytest
from django.urls import reverse

from serving import keys
from serving.models import ApiKey
from tenancy.choices import Role
from tests import factories
from tests.queries import queries_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def project_keys(roles):
    issued = keys.api_key_create(project=roles.project, name="frontend", actor=roles.developer)
    return roles, issued.key


def keys_url(project) -> str:
    return reverse("api-key-list", args=[project.pk])


@pytest.mark.parametrize(
    ("who", "list_status", "create_status"),
    [
        ("developer", 200, 201),
        ("lead", 200, 201),
        ("approver", 200, 403),
        ("other_developer", 404, 404),
        ("outsider", 404, 404),
        ("operator", 200, 403),
    ],
)
def test_key_list_and_create_follow_the_role_matrix(project_keys, api_as, who, list_status, create_status):
    roles, key = project_keys
    client = api_as(getattr(roles, who))
    listed = client.get(keys_url(roles.project))
    assert listed.status_code == list_status
    if list_status == 200:
        assert [row["prefix"] for row in listed.json()] == [key.prefix]
        assert "hashed" not in listed.json()[0] and "key" not in listed.json()[0]
    created = client.post(keys_url(roles.project), {"name": "batch"}, format="json")
    assert created.status_code == create_status
    if create_status == 201:
        assert keys.api_key_authenticate(created.json()["key"]).name == "batch"


def test_anonymous_is_refused_everywhere(project_keys, api):
    roles, key = project_keys
    assert api.get(keys_url(roles.project)).status_code == 401
    assert api.post(reverse("api-key-rotate", args=[key.pk])).status_code == 401
    assert api.post(reverse("api-key-revoke", args=[key.pk])).status_code == 401


def test_rotation_replaces_the_key_and_revocation_is_final(project_keys, api_as):
    roles, key = project_keys
    client = api_as(roles.developer)
    rotated = client.post(reverse("api-key-rotate", args=[key.pk]))
    assert rotated.status_code == 201
    new_secret = rotated.json()["key"]
    key.refresh_from_db()
    assert key.active and key.expires_at is not None  # the default grace period: 24 h
    assert key.replaced_by.prefix == rotated.json()["prefix"]
    assert keys.api_key_authenticate(new_secret) is not None
    twice = client.post(reverse("api-key-rotate", args=[key.pk]))
    assert twice.status_code == 409 and twice.json()["code"] == "key_rotated"
    ended = client.post(reverse("api-key-revoke", args=[key.pk]))  # revoking ends the grace period
    assert ended.status_code == 200 and ended.json()["active"] is False
    again = client.post(reverse("api-key-revoke", args=[key.pk]))
    assert again.status_code == 409 and again.json()["code"] == "key_revoked"
    revoked = client.post(reverse("api-key-revoke", args=[key.replaced_by.pk]))
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert keys.api_key_authenticate(new_secret) is None


@pytest.mark.parametrize(("who", "status"), [("approver", 403), ("other_developer", 404), ("operator", 403)])
def test_only_members_who_order_rotate_or_revoke(project_keys, api_as, who, status):
    roles, key = project_keys
    assert api_as(getattr(roles, who)).post(reverse("api-key-revoke", args=[key.pk])).status_code == status
    key.refresh_from_db()
    assert key.active


def test_create_needs_a_name(project_keys, api_as):
    roles, _ = project_keys
    answer = api_as(roles.developer).post(keys_url(roles.project), {"name": ""}, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "validation_error"


def test_key_list_query_count_is_constant(project_keys, api_as):
    roles, _ = project_keys
    client = api_as(roles.developer)
    few = queries_for(client, keys_url(roles.project))
    for n in range(5):
        keys.api_key_create(project=roles.project, name=f"k{n}", actor=roles.developer)
    assert queries_for(client, keys_url(roles.project)) == few


def test_page_key_actions_are_for_members_of_the_project(deployed_for_pages, client):
    request, outsider = deployed_for_pages
    client.force_login(outsider)
    assert client.post(reverse("serving-key-create", args=[request.pk]), {"name": "x"}).status_code == 404
    assert not ApiKey.objects.filter(name="x").exists()
    client.logout()
    assert client.post(reverse("serving-key-create", args=[request.pk]), {"name": "x"}).status_code == 302


@pytest.fixture
def deployed_for_pages(serving):
    request = serving.order()
    return request, factories.member(factories.project())


@pytest.mark.parametrize("model", ["servingdeployment", "apikey"])
def test_console_changelists_are_constant_and_hide_secrets(serving, console, model):
    serving.order()
    url = f"/admin/serving/{model}/"
    keys.api_key_create(project=serving.team.project, name="one", actor=serving.team.developer)
    few = queries_for(console, url)
    for n in range(3):
        keys.api_key_create(project=serving.team.project, name=f"k{n}", actor=serving.team.developer)
    assert queries_for(console, url) == few
    assert b"hashed" not in console.get(url).content


def test_developers_do_not_get_the_console(serving, client):
    client.force_login(factories.member(serving.team.project, Role.LEAD))
    assert client.get("/admin/serving/apikey/").status_code == 302


def test_page_rotate_and_revoke_return_to_the_request_page(deployed_for_pages, client):
    request, _outsider = deployed_for_pages
    key = keys.api_key_create(project=request.project, name="k", actor=request.requester).key
    client.force_login(request.requester)
    page = reverse("portal:request-detail", args=[request.pk])
    rotated = client.post(reverse("serving-key-rotate", args=[key.pk]), {"request": request.pk})
    assert rotated.status_code == 302 and rotated["Location"] == page + "#new-key"
    assert 'id="new-key"' in client.get(page).content.decode()
    assert client.post(reverse("serving-key-revoke", args=[key.pk]), {"request": "x"}).status_code == 404
    revoked = client.post(reverse("serving-key-revoke", args=[key.pk]), {"request": request.pk})
    assert revoked.status_code == 302 and revoked["Location"] == page
    again = client.post(reverse("serving-key-revoke", args=[key.pk]), {"request": request.pk}, follow=True)
    assert "already revoked" in again.content.decode()
