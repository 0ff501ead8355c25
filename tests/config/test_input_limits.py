"""Input the API cannot take is a 4xx {code, message, details}: bodies and query strings over their limits (413,
414, also through a real gunicorn on a keep-alive connection), JSON too deep, NUL characters, non-finite numbers,
ids beyond bigint, Django's own refusals; and a POST to an unknown API path is a JSON 404."""

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent

from config.api import exception_handler
from tests import factories
from tests.scheduling.health_inventory import ingest_user

pytestmark = pytest.mark.django_db

ERROR_KEYS = {"code", "message", "details"}
HEALTH_URL = "/api/v1/health/events/"


def _error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content[:500]
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert body["code"] == code
    return body


@pytest.fixture
def agent(db):
    """A central exporter's account (staff with ingest_health): it may speak for any node."""
    return ingest_user()


def test_a_body_over_the_limit_is_a_json_413_before_any_view_reads_it(api_as, agent, settings):
    settings.REQUEST_MAX_BODY_BYTES = 1000

    response = api_as(agent).post(HEALTH_URL, {"events": [{"node": "n" * 2000, "signal": "x", "value": 1}]})

    body = _error(response, 413, "request_too_large")
    assert body["details"]["limit_bytes"] == 1000
    assert body["details"]["content_length"] > 1000


def test_a_query_string_over_the_limit_is_a_json_414(api_as, roles, settings):
    settings.REQUEST_MAX_QUERY_STRING_LENGTH = 100

    response = api_as(roles.developer).get("/api/v1/requests/", {"state": "x" * 200})

    body = _error(response, 414, "query_string_too_long")
    assert body["details"] == {"limit": 100, "length": len("state=") + 200}


def test_django_refusing_a_body_as_too_big_is_a_413_in_the_error_shape(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048

    response = exception_handler(RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE."), {})

    assert response.status_code == 413
    assert response.data == {
        "code": "request_too_large",
        "message": "The request body may be at most 2048 bytes.",
        "details": {"limit_bytes": 2048},
    }


def test_django_refusing_a_request_as_suspicious_is_a_400_in_the_error_shape():
    response = exception_handler(TooManyFieldsSent("The number of GET/POST parameters exceeded the limit."), {})

    assert response.status_code == 400
    assert set(response.data) == ERROR_KEYS
    assert response.data["code"] == "bad_request"


def test_json_nested_deeper_than_the_interpreter_can_decode_is_a_400(api_as, agent):
    deep = '{"events": ' + "[" * 5000 + "]" * 5000 + "}"

    response = api_as(agent).post(HEALTH_URL, deep, content_type="application/json")

    _error(response, 400, "json_too_deep")


def test_json_nested_deeper_than_the_limit_is_a_400_naming_where(api_as, agent, settings):
    settings.API_JSON_MAX_DEPTH = 4

    response = api_as(agent).post(HEALTH_URL, {"events": [{"value": {"a": {"b": 1}}}]})

    body = _error(response, 400, "json_too_deep")
    assert body["details"] == {"max_depth": 4, "path": "events.0.value.a"}


@pytest.mark.parametrize(
    "document",
    [
        {"events": [{"node": "n1\x00", "signal": "temperature", "value": 95}]},
        {"events": [{"node\x00": "n1", "signal": "temperature", "value": 95}]},
    ],
)
def test_a_nul_character_in_a_json_string_or_key_is_a_400(api_as, agent, document):
    response = api_as(agent).post(HEALTH_URL, document)

    body = _error(response, 400, "nul_character")
    assert body["details"]["path"].startswith("events.0")


def test_a_nul_character_in_exposition_text_is_a_400(api_as, agent):
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1\x00"} 95\n'

    response = api_as(agent).post(HEALTH_URL, text, content_type="text/plain; version=0.0.4")

    _error(response, 400, "nul_character")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_number_json_cannot_carry_is_a_400(api_as, agent, number):
    body = '{"events": [{"node": "n1", "signal": "temperature", "value": NUMBER}]}'.replace("NUMBER", number)

    response = api_as(agent).post(HEALTH_URL, body, content_type="application/json")

    _error(response, 400, "parse_error")


def test_an_id_beyond_bigint_in_a_body_is_a_400(api_as, roles):
    response = api_as(roles.approver).post("/api/v1/approvals/bulk-approve/", {"ids": [1130530173853342105600]})

    body = _error(response, 400, "validation_error")
    assert "ids" in body["details"]


@pytest.mark.parametrize("project", ["3.93e+37", "1130530173853342105600", "1.5", "0"])
def test_an_id_filter_that_can_name_no_project_is_a_400(api_as, roles, project):
    for url in (
        "/api/v1/queue/",
        "/api/v1/requests/",
        "/api/v1/quota-change-requests/",
        "/api/v1/usage/",
        "/api/v1/usage/budgets/",
    ):
        response = api_as(roles.developer).get(url, {"project": project, "page_size": 18714156})

        body = _error(response, 400, "validation_error")
        assert "project" in body["details"]


def test_a_post_to_an_unknown_api_path_is_a_json_404_not_a_csrf_page(client):
    response = client.post("/api/v1/requests/%C2%84/cancel/", {"reason": ""}, content_type="application/json")

    _error(response, 404, "not_found")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_10_mb_health_body_is_a_413_and_the_keep_alive_connection_still_serves(served_app, agent):
    base_url, _log = served_app
    connections = []  # the client's address of each response's connection: one address, one connection

    def note_connection(response):
        connections.append(response.extensions["network_stream"].get_extra_info("client_addr"))

    headers = {"Authorization": f"Token {factories.token_for(agent)}"}
    with httpx.Client(
        base_url=base_url, timeout=60, headers=headers, event_hooks={"response": [note_connection]}
    ) as client:
        too_big = client.post(
            HEALTH_URL,
            content=b"# HELP x\n" * (10 * 1024 * 1024 // 9),
            headers={"Content-Type": "text/plain; version=0.0.4"},
        )
        follow_up = client.get("/api/v1/catalog/services/")

    _error(too_big, 413, "request_too_large")
    assert follow_up.status_code == 200, follow_up.content[:500]
    assert connections[0] == connections[1]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize(("length", "code"), [(3000, "query_string_too_long"), (9000, "request_line_too_long")])
def test_a_long_query_string_is_a_json_414_from_the_app_or_from_gunicorn(served_app, length, code):
    base_url, _log = served_app

    response = httpx.get(f"{base_url}/api/v1/catalog/services/", params={"q": "x" * length}, timeout=30)

    _error(response, 414, code)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_request_gunicorn_refuses_itself_is_answered_in_the_error_shape(served_app):
    base_url, _log = served_app
    address = urlsplit(base_url)

    with socket.create_connection((address.hostname, address.port), timeout=30) as raw:
        raw.sendall(b"GET /api/v1/catalog/services/ HTTP/1.1\r\nHost: x\r\nX-Probe: a\x00b\r\n\r\n")
        answer = b"".join(iter(lambda: raw.recv(65536), b""))  # gunicorn closes after its own refusals

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"Content-Type: application/json" in head
    error = json.loads(body)
    assert set(error) == ERROR_KEYS
    assert error["code"] == "bad_request"
