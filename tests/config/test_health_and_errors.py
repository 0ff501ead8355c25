"""Service endpoints: health, JSON errors for the API, the OpenAPI schema and docs, the home page."""

import pytest
from rest_framework.response import Response

from config import views
from config.api import exception_handler
from config.errors import Conflict, DomainError, NotPermitted

pytestmark = pytest.mark.django_db

ERROR_KEYS = {"code", "message", "details"}


def test_healthz_reports_database_and_queue_ok(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["database"]["vendor"] == "postgresql"
    assert body["checks"]["queue"]["ok"] is True


def test_healthz_is_not_cached(client):
    response = client.get("/healthz")

    assert "no-cache" in response["Cache-Control"]


def test_healthz_is_503_when_the_database_check_fails(client, monkeypatch):
    monkeypatch.setattr(views, "_check_database", lambda: {"ok": False})

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert response.json()["checks"]["database"] == {"ok": False}


def test_unknown_api_path_is_404_json(client):
    response = client.get("/api/v1/no-such-thing/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert set(response.json()) == ERROR_KEYS
    assert response.json()["code"] == "not_found"


def test_exception_handler_turns_domain_error_into_its_status_and_body():
    error = DomainError("Over quota.", code="quota_exhausted", details={"gpus": {"limit": "4", "asked": "8"}})

    response = exception_handler(error, {})

    assert isinstance(response, Response)
    assert response.status_code == 422
    assert response.data == {
        "code": "quota_exhausted",
        "message": "Over quota.",
        "details": {"gpus": {"limit": "4", "asked": "8"}},
    }


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (Conflict("Already taken."), 409, "conflict"),
        (NotPermitted("Not yours."), 403, "permission_denied"),
        (DomainError("Bad."), 422, "invalid_request"),
    ],
)
def test_exception_handler_uses_each_domain_error_class_default(error, status, code):
    response = exception_handler(error, {})

    assert response.status_code == status
    assert response.data == {"code": code, "message": str(error), "details": {}}


def test_schema_is_public(client):
    response = client.get("/api/schema/")

    assert response.status_code == 200
    assert b"/api/v1/projects/" in response.content


def test_docs_page_serves_swagger_from_local_assets(client):
    response = client.get("/api/docs/")

    assert response.status_code == 200
    body = response.content.decode()
    assert "swagger" in body.lower()
    assert "cdn.jsdelivr" not in body


def test_home_page_asks_anonymous_visitors_to_sign_in(client):
    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    login = client.get(response["Location"])
    assert login.status_code == 200
    assert b"/api/docs/" in login.content
