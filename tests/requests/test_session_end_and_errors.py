"""An expired session never breaks a live page: htmx updates of a signed-out browser get 401 session_ended (never the
sign-in page swapped into the page), a form posted while signed out comes back after the sign-in, a form sent
without its CSRF cookie gets a page of the product's own saying what to do, and so does a refused page (403)."""

import html
import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from requests import services
from requests.models import ResourceRequest
from tests.requests.conftest import make_order, order_post

HTMX = {"HTTP_HX_REQUEST": "true"}


def _next_of(location: str) -> str:
    return parse_qs(urlsplit(location).query)["next"][0]


def test_the_order_preview_of_a_signed_out_browser_answers_session_ended_not_the_sign_in_page(client, shop, team):
    page = f"/order/{shop.service.slug}/?project={team.project.pk}"
    response = client.post(
        f"/order/{shop.service.slug}/preview/",
        order_post(shop, team.project),
        **HTMX,
        HTTP_HX_CURRENT_URL=f"http://testserver{page}",
    )

    assert response.status_code == 401
    body = response.json()
    assert body["code"] == "session_ended" and body["message"] == "Your session ended — sign in again."
    sign_in = body["details"]["sign_in_url"]
    assert sign_in.startswith("/accounts/login/?next=")
    assert _next_of(sign_in) == f"{page}&resume=1"  # back to the page the person is on, its form put back
    assert b"id_password" not in response.content


def test_a_request_page_polling_after_the_session_ended_gets_session_ended(client, shop, team):
    response = client.get("/requests/1/status/", **HTMX, HTTP_HX_CURRENT_URL="http://testserver/requests/1/")

    assert response.status_code == 401
    assert _next_of(response.json()["details"]["sign_in_url"]) == "/requests/1/?resume=1"


def test_the_page_to_come_back_to_is_never_another_site(client, shop, team):
    response = client.get("/requests/1/status/", **HTMX, HTTP_HX_CURRENT_URL="https://evil.example/phish/")

    assert _next_of(response.json()["details"]["sign_in_url"]) == "/?resume=1"


def test_pages_opened_while_signed_out_still_go_to_the_sign_in_page(client, shop, team):
    response = client.get(f"/order/{shop.service.slug}/")

    assert response.status_code == 302
    assert _next_of(response["Location"]) == f"/order/{shop.service.slug}/"


def test_an_order_posted_after_the_session_ended_goes_to_the_sign_in_and_back_with_its_form(client, shop, team):
    response = client.post(f"/order/{shop.service.slug}/?project={team.project.pk}", order_post(shop, team.project))

    assert response.status_code == 302
    assert _next_of(response["Location"]) == f"/order/{shop.service.slug}/?project={team.project.pk}&resume=1"
    assert not ResourceRequest.objects.exists()
    sign_in = client.get(response["Location"])
    assert b'id="session-ended-notice"' in sign_in.content


def test_signing_out_still_lands_on_a_plain_sign_in_page(client, team):
    client.force_login(team.developer)

    response = client.post("/accounts/logout/")

    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert b"session-ended-notice" not in client.get(response["Location"]).content


def test_the_order_page_a_sign_in_returns_to_takes_resume_as_no_choice_of_the_order(client, shop, team):
    client.force_login(team.developer)

    response = client.get(f"/order/{shop.service.slug}/?project={team.project.pk}&resume=1")

    assert response.status_code == 200
    assert "resume" not in response.content.decode()  # no "the link's resume is not an option" notice
    assert b"data-keep-draft" in response.content  # the form whose draft portal.js puts back


@pytest.fixture
def csrf_client():
    return Client(enforce_csrf_checks=True)


def test_a_form_sent_without_its_csrf_cookie_gets_a_product_page_saying_what_to_do(csrf_client, shop, team):
    order_page = f"/order/{shop.service.slug}/?project={team.project.pk}"
    response = csrf_client.post(
        f"/order/{shop.service.slug}/",
        {**order_post(shop, team.project), "csrfmiddlewaretoken": "x" * 64},
        HTTP_REFERER=f"http://testserver{order_page}",
    )

    assert response.status_code == 403
    body = response.content.decode()
    assert 'data-code="csrf_failed"' in body and "Your form was not sent" in body
    assert "cookies for this site were cleared or are blocked" in body
    assert "CSRF verification failed" not in body  # not Django's page
    sign_in = html.unescape(re.search(r'href="([^"]+)" id="problem-sign-in"', body)[1])
    assert _next_of(sign_in) == f"{order_page}&resume=1"  # back to the form, which portal.js kept when it was sent
    assert not ResourceRequest.objects.exists()


def test_a_live_update_without_its_csrf_cookie_is_a_session_ended_answer(csrf_client, shop, team):
    response = csrf_client.post(
        f"/order/{shop.service.slug}/preview/",
        order_post(shop, team.project),
        **HTMX,
        HTTP_HX_CURRENT_URL=f"http://testserver/order/{shop.service.slug}/",
    )

    assert response.status_code == 401 and response.json()["code"] == "session_ended"


def test_a_signed_in_form_with_a_stale_token_is_told_to_open_the_page_again(csrf_client, shop, team):
    csrf_client.force_login(team.developer)
    csrf_client.get(f"/order/{shop.service.slug}/")  # sets the CSRF cookie

    response = csrf_client.post(f"/order/{shop.service.slug}/", {"csrfmiddlewaretoken": "y" * 64})

    assert response.status_code == 403
    assert b'id="problem-back"' in response.content and b"problem-sign-in" not in response.content


def test_a_refused_page_is_the_product_s_403_page_with_the_reason(client, shop, team):
    theirs = services.request_submit(order=make_order(shop, team.project), requester=team.developer2)
    client.force_login(team.developer)

    response = client.get(f"/requests/{theirs.pk}/release/")

    assert response.status_code == 403
    body = response.content.decode()
    assert 'data-status="403"' in body and "You may see this request but not do this." in body
