"""Token scopes (config/scopes.py): every API route needs one, a token without it is refused 403 `token_scope` naming
it (the role matrix's "service token with too little scope"), and a session is never scoped."""

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from config.scopes import required_scope
from tenancy.choices import TokenScope
from tenancy.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db


def api_views(patterns=None, prefix=""):
    for pattern in patterns if patterns is not None else get_resolver().url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from api_views(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern) and route.startswith("api/v1/"):
            view_class = getattr(pattern.callback, "cls", None)
            if view_class is not None:
                yield route, view_class


def test_every_api_route_needs_a_scope_for_each_method():
    unscoped = [
        (route, method)
        for route, view_class in api_views()
        if route != "api/v1/auth/token/"
        for method in ("GET", "POST")
        if required_scope(view_class, method) not in TokenScope.values
    ]
    assert unscoped == []


@pytest.mark.parametrize(
    ("method", "path", "scopes", "status", "missing"),
    [
        ("get", "/api/v1/catalog/services/", ["catalog:read"], 200, None),
        ("get", "/api/v1/projects/", ["catalog:read"], 403, "projects:read"),
        ("get", "/api/v1/requests/", ["catalog:read", "projects:read"], 403, "requests:read"),
        ("post", "/api/v1/requests/", ["requests:read"], 403, "requests:write"),
        ("get", "/api/v1/usage/", ["requests:read"], 403, "usage:read"),
        ("get", "/api/v1/requests/", ["requests:read"], 200, None),
    ],
)
def test_a_token_outside_its_scopes_is_refused_naming_the_missing_scope(
    api, roles, method, path, scopes, status, missing
):
    secret = factories.token_for(roles.developer, scopes=scopes)
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")

    response = getattr(api, method)(path, {}, format="json")

    assert response.status_code == status, response.content
    if missing:
        assert response.json()["code"] == "token_scope"
        assert response.json()["details"] == {"missing_scope": missing, "token_scopes": scopes}
        assert missing in response.json()["message"]


def test_a_session_is_not_scoped_and_a_persons_token_has_every_scope_by_default(api, client, roles):
    client.force_login(roles.developer)
    assert client.get("/api/v1/usage/").status_code == 200
    response = api.post(
        "/api/v1/auth/token/", {"username": roles.developer.username, "password": factories.PASSWORD}, format="json"
    )
    assert response.json()["scopes"] == TokenScope.values
    narrowed = api.post(
        "/api/v1/auth/token/",
        {"username": roles.developer.username, "password": factories.PASSWORD, "scopes": ["catalog:read"]},
        format="json",
    )
    assert narrowed.json()["scopes"] == ["catalog:read"]
    unknown = api.post(
        "/api/v1/auth/token/",
        {"username": roles.developer.username, "password": factories.PASSWORD, "scopes": ["everything"]},
        format="json",
    )
    assert unknown.status_code == 422 and unknown.json()["code"] == "invalid_scope"
    assert unknown.json()["details"]["unknown"] == ["everything"]


def test_a_tokens_use_from_a_new_address_is_audited(api, roles):
    secret = factories.token_for(roles.developer)
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    api.get("/api/v1/projects/")
    assert not AuditEvent.objects.filter(action="api_token.used").exists()  # same address as last time

    api.get("/api/v1/projects/", REMOTE_ADDR="10.1.2.3")

    used = AuditEvent.objects.get(action="api_token.used")
    assert (used.data["address"], used.data["previous_address"]) == ("10.1.2.3", "127.0.0.1")
