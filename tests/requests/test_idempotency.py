"""Back after submit, then submit again, never makes a silent duplicate: one idempotency key per rendered order form
(the page asks "you submitted the same order as #N … submit another?"), the same order from another form within
minutes is asked about too, the API takes an Idempotency-Key header, and the approval inbox marks likely duplicates."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from requests import services
from requests.models import ResourceRequest
from tests.requests.conftest import approval_rule, approver_stage, make_order, order_post

pytestmark = pytest.mark.django_db


def _key_on(page) -> str:
    return re.search(r'name="idempotency_key" value="([0-9a-f]{32})"', page.content.decode())[1]


def _order_page(client, shop, team):
    return client.get(f"/order/{shop.service.slug}/?project={team.project.pk}")


def test_every_rendered_order_form_has_a_key_of_its_own(client, shop, team):
    client.force_login(team.developer)

    assert _key_on(_order_page(client, shop, team)) != _key_on(_order_page(client, shop, team))


def test_the_same_form_sent_again_asks_instead_of_making_a_second_request(client, shop, team):
    client.force_login(team.developer)
    sent = order_post(shop, team.project, idempotency_key=_key_on(_order_page(client, shop, team)))
    first = client.post(f"/order/{shop.service.slug}/", sent)
    made = ResourceRequest.objects.get()
    assert first.status_code == 302

    again = client.post(f"/order/{shop.service.slug}/", sent)  # Back, then Submit once more

    assert again.status_code == 409
    body = again.content.decode()
    assert f'You submitted the same order as <a href="/requests/{made.pk}/">#{made.pk}</a>' in body
    assert "Submit another?" in body and 'id="submit-another"' in body
    assert ResourceRequest.objects.count() == 1
    assert _key_on(again) != sent["idempotency_key"]  # "Submit another" sends a key of its own


def test_submit_another_makes_a_second_request_and_that_page_sent_again_asks_about_it(client, shop, team):
    client.force_login(team.developer)
    sent = order_post(shop, team.project, idempotency_key=_key_on(_order_page(client, shop, team)))
    client.post(f"/order/{shop.service.slug}/", sent)
    asked = client.post(f"/order/{shop.service.slug}/", sent)
    another = {**sent, "idempotency_key": _key_on(asked), "confirm_duplicate": "1"}

    second = client.post(f"/order/{shop.service.slug}/", another)

    assert second.status_code == 302
    assert ResourceRequest.objects.count() == 2
    made = ResourceRequest.objects.latest("id")
    again = client.post(f"/order/{shop.service.slug}/", another)
    assert again.status_code == 409 and f'data-request="{made.pk}"' in again.content.decode()
    assert ResourceRequest.objects.count() == 2


def test_the_same_form_sent_again_with_other_choices_asks_too(client, shop, team):
    client.force_login(team.developer)
    key = _key_on(_order_page(client, shop, team))
    client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, idempotency_key=key))

    changed = client.post(
        f"/order/{shop.service.slug}/", order_post(shop, team.project, idempotency_key=key, duration_hours=20)
    )

    assert changed.status_code == 409
    assert "You submitted this form as" in changed.content.decode()
    assert "other choices" in changed.content.decode()
    assert ResourceRequest.objects.count() == 1


def test_the_same_order_from_a_new_form_within_minutes_is_asked_about_but_not_later(client, shop, team):
    client.force_login(team.developer)
    client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, idempotency_key="a" * 32))

    soon = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, idempotency_key="b" * 32))
    assert soon.status_code == 409 and "You submitted the same order as" in soon.content.decode()
    ResourceRequest.objects.update(created_at=timezone.now() - timedelta(minutes=11))
    later = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, idempotency_key="c" * 32))

    assert later.status_code == 302
    assert ResourceRequest.objects.count() == 2


def test_a_refused_submission_sent_again_is_simply_submitted(client, shop, team):
    client.force_login(team.developer)
    key = _key_on(_order_page(client, shop, team))
    refused = client.post(
        f"/order/{shop.service.slug}/", order_post(shop, team.project, idempotency_key=key, duration_hours=100000)
    )
    assert refused.status_code in (400, 422)

    fixed = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, idempotency_key=key))

    assert fixed.status_code == 302 and ResourceRequest.objects.count() == 1


# --- the API's Idempotency-Key header ---------------------------------------------------------------------


def _api_order(shop, team, **overrides) -> dict:
    body = {"service": shop.service.pk, "project": team.project.pk, "spec": shop.whole.pk, "image": shop.image.pk}
    return {**body, "duration_hours": 10, **overrides}


def test_an_api_order_sent_again_with_its_key_answers_the_request_it_made(api_as, shop, team):
    api = api_as(team.developer)
    first = api.post("/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY="order-1")

    again = api.post("/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY="order-1")

    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert ResourceRequest.objects.count() == 1


def test_a_structured_field_key_in_quotes_is_the_same_key(api_as, shop, team):
    api = api_as(team.developer)
    api.post("/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY="order-2")

    again = api.post("/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY='"order-2"')

    assert again["Idempotent-Replayed"] == "true" and ResourceRequest.objects.count() == 1


def test_an_api_key_sent_with_another_order_is_refused(api_as, shop, team):
    api = api_as(team.developer)
    first = api.post("/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY="order-3")

    other = api.post(
        "/api/v1/requests/", _api_order(shop, team, duration_hours=5), format="json", HTTP_IDEMPOTENCY_KEY="order-3"
    )

    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"
    assert other.json()["details"] == {"request": first.json()["id"]}
    assert ResourceRequest.objects.count() == 1


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "naïve"])
def test_a_malformed_key_is_a_400_and_stores_nothing(api_as, shop, team, key):
    response = api_as(team.developer).post(
        "/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY=key
    )

    assert response.status_code == 400
    assert response.json()["code"] == "validation_error" and "Idempotency-Key" in response.json()["details"]
    assert not ResourceRequest.objects.exists()


def test_keys_belong_to_their_sender(api_as, shop, team):
    api_as(team.developer).post("/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY="k")

    theirs = api_as(team.developer2).post(
        "/api/v1/requests/", _api_order(shop, team), format="json", HTTP_IDEMPOTENCY_KEY="k"
    )

    assert theirs.status_code == 201 and not theirs.has_header("Idempotent-Replayed")
    assert ResourceRequest.objects.count() == 2


def test_the_schema_documents_the_header(client):
    operation = client.get("/api/schema/?format=json").json()["paths"]["/api/v1/requests/"]["post"]

    assert any(parameter["name"] == "Idempotency-Key" for parameter in operation["parameters"])


# --- the approval inbox -------------------------------------------------------------------------------------


def test_the_inbox_marks_likely_duplicates_and_filters_them(client, shop, team):
    approval_rule(approver_stage())
    first = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    second = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    other = services.request_submit(order=make_order(shop, team.project, duration_hours=3), requester=team.developer)
    theirs = services.request_submit(order=make_order(shop, team.project), requester=team.developer2)
    client.force_login(team.approver)

    body = client.get("/approvals/").content.decode()

    rows = {pk: body[body.index(f'href="/requests/{pk}/">#{pk}</a> ') :] for pk in (first.pk, second.pk)}
    assert f'data-duplicate-of="{second.pk}"' in rows[first.pk].split("</tr>")[0]
    assert f'data-duplicate-of="{first.pk}"' in rows[second.pk].split("</tr>")[0]
    assert "less than a minute earlier (pending approval)" in rows[second.pk].split("</tr>")[0]
    assert body.count("likely duplicate") == 2  # neither the other order nor another person's same order
    filtered = client.get("/approvals/?flag=duplicate").content.decode()
    assert f"#{other.pk}<" not in filtered and f"#{theirs.pk}<" not in filtered and f"#{first.pk}<" in filtered
