"""An expired session in a real browser (Debian's chromium through Playwright): the order page says "Your session
ended — sign in again" without swapping the sign-in page into the preview or moving the focus, and what was typed
comes back after the sign-in; with both cookies gone, the form's submission shows the product's own page and the
sign-in from there comes back to the form as it was."""

import pytest

from requests.models import ResourceRequest
from tests import factories
from tests.requests.test_browser import browser, signed_in  # noqa: F401 (the fixture)


def _sign_in_on_this_page(page, user):
    page.fill("#id_username", user.username)
    page.fill("#id_password", factories.PASSWORD)
    page.click("button[type=submit]")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_order_page_survives_an_expired_session(browser, live_server, shop, team):  # noqa: F811
    page = signed_in(browser, live_server, team.developer)
    page.goto(f"{live_server.url}/order/{shop.service.slug}/?project={team.project.pk}")
    page.wait_for_selector("#preview-cost")
    page.fill("#id_justification", "Nightly evaluation of the vision model")
    page.context.clear_cookies(name="sessionid")  # the session ends; the CSRF cookie stays, as after an expiry

    page.fill("#id_duration_hours", "7")
    page.press("#id_duration_hours", "Tab")  # a change: the preview asks the server
    page.wait_for_selector("#page-problem >> text=Your session ended — sign in again")

    assert page.locator("#preview #id_password").count() == 0  # no sign-in page inside the preview
    assert "Cost per hour" in page.inner_text("#preview")  # the last preview stays
    assert page.evaluate("document.activeElement.id") != "id_username"
    page.fill("#id_justification", "Nightly evaluation of the vision model, 7 h")  # typed after the session ended
    page.click("#sign-in-again")
    page.wait_for_selector("#session-ended-notice")
    _sign_in_on_this_page(page, team.developer)

    page.wait_for_selector("#draft-restored")
    assert "resume" not in page.url
    assert page.input_value("#id_justification") == "Nightly evaluation of the vision model, 7 h"
    assert page.input_value("#id_duration_hours") == "7"
    page.wait_for_selector("#preview-cost >> text=for 7 h")  # the preview follows the restored form
    assert page.inner_text("#page-problem") == ""


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_an_order_sent_with_both_cookies_gone_gets_a_product_page_and_comes_back_after_sign_in(
    browser,  # noqa: F811
    live_server,
    shop,
    team,
):
    page = signed_in(browser, live_server, team.developer)
    page.goto(f"{live_server.url}/order/{shop.service.slug}/?project={team.project.pk}")
    page.wait_for_selector("#preview-cost")
    page.fill("#id_duration_hours", "9")
    page.fill("#id_justification", "Ablation study")
    page.context.clear_cookies()

    page.click("text=Submit request")
    page.wait_for_selector("#problem[data-code=csrf_failed]")
    assert "Your form was not sent" in page.inner_text("main")
    assert "CSRF" not in page.inner_text("body")
    page.click("#problem-sign-in")
    _sign_in_on_this_page(page, team.developer)

    page.wait_for_selector("#draft-restored")
    assert page.input_value("#id_duration_hours") == "9"
    assert page.input_value("#id_justification") == "Ablation study"
    assert not ResourceRequest.objects.exists()
    page.wait_for_selector("#preview-cost >> text=for 9 h")
    page.click("text=Submit request")
    page.wait_for_selector("#request-state")
    assert ResourceRequest.objects.get().duration_hours == 9
