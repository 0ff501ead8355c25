"""An order's parameters the platform cannot even parse are a 400 at submission and at preview, and nothing is
stored: NUL characters (PostgreSQL cannot store them) and nesting deeper than the JSON limit. Keys, sizes and
ranges beyond the service's parameter schema are its 422s (tests/requests/test_api.py, tests/catalog)."""

import json

import pytest

from requests.models import RequestEvent, ResourceRequest
from tests.requests.test_api import ERROR_KEYS, PREVIEW, REQUESTS, order_body

pytestmark = pytest.mark.django_db

ENDPOINTS = [REQUESTS, PREVIEW]


def _refused(response, code: str) -> dict:
    assert response.status_code == 400, response.content[:500]
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert body["code"] == code
    assert not ResourceRequest.objects.exists()
    assert not RequestEvent.objects.exists()
    return body


@pytest.mark.parametrize("url", ENDPOINTS)
@pytest.mark.parametrize("parameters", [{"env\x00ironment": "production"}, {"environment": "prod\x00uction"}])
def test_a_nul_character_in_a_parameter_key_or_value_is_refused(api_as, shop, team, url, parameters):
    response = api_as(team.developer).post(url, order_body(shop, team.project, parameters=parameters))

    body = _refused(response, "nul_character")
    assert body["details"]["path"].startswith("parameters")


@pytest.mark.parametrize("url", ENDPOINTS)
def test_parameters_nested_5000_deep_are_refused(api_as, shop, team, url):
    body = json.dumps(order_body(shop, team.project))[:-1] + ', "parameters": ' + '{"a": ' * 5000 + "1" + "}" * 5001

    response = api_as(team.developer).post(url, body, content_type="application/json")

    _refused(response, "json_too_deep")
