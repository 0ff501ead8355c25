"""Phone width (390 px) in a real browser (Debian's chromium through Playwright), on the seeded demo: the order
preview comes before the Submit button, the usage page stays within the screen, and the catalog's filter panel is
folded so that the first offering is on the first screen (on a laptop everything stays where it was)."""

import pytest
from django.core.management import call_command

from tenancy.models import User
from tests import factories
from tests.requests.test_browser import (  # noqa: F401 (the fixture)
    LAPTOP,
    PHONE,
    browser,
    horizontal_overflow,
    signed_in,
)

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def developer(settings):
    settings.DEBUG = True
    call_command("seed_demo")
    user = User.objects.get(username="developer")
    user.set_password(factories.PASSWORD)  # what signed_in types
    user.save()
    return user


def _box(page, selector) -> dict:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not shown"
    return box


def test_the_order_preview_comes_before_the_submit_button_on_a_phone(browser, live_server, developer):  # noqa: F811
    phone = signed_in(browser, live_server, developer, viewport=PHONE)
    phone.goto(f"{live_server.url}/order/gpu-workspace/")
    phone.wait_for_selector("#preview-cost")

    assert _box(phone, "#order-preview")["y"] < _box(phone, "#submit-order")["y"]
    assert _box(phone, "#order-form")["y"] < _box(phone, "#order-preview")["y"]
    assert horizontal_overflow(phone) == 0

    laptop = signed_in(browser, live_server, developer, viewport=LAPTOP)
    laptop.goto(f"{live_server.url}/order/gpu-workspace/")
    laptop.wait_for_selector("#preview-cost")
    form, preview, submit = (_box(laptop, selector) for selector in ("#order-form", "#order-preview", "#submit-order"))
    assert preview["x"] > form["x"] + form["width"] - 1  # beside the form, as before
    assert form["y"] + form["height"] <= submit["y"]  # the buttons right under the fields
    assert submit["y"] - (form["y"] + form["height"]) < 40


def test_the_usage_page_stays_within_a_phone_s_width(browser, live_server, developer):  # noqa: F811
    page = signed_in(browser, live_server, developer, viewport=PHONE)
    page.goto(f"{live_server.url}/usage/")
    page.wait_for_selector("#budget-table")

    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert horizontal_overflow(page) == 0


def test_the_catalog_folds_its_filters_on_a_phone_so_the_first_offering_is_on_the_first_screen(
    browser,  # noqa: F811
    live_server,
    developer,
):
    phone = signed_in(browser, live_server, developer, viewport=PHONE)
    phone.goto(f"{live_server.url}/")
    first_offering = phone.locator("section.card tbody tr a").first

    assert phone.evaluate("document.getElementById('filter-panel').open") is False
    box = first_offering.bounding_box()
    assert box["y"] + box["height"] <= PHONE["height"], f"the first offering ends at {box['y'] + box['height']} px"
    assert horizontal_overflow(phone) == 0
    phone.click("#filter-panel > summary")  # the filters are one tap away
    assert phone.locator("#id_q").is_visible()

    laptop = signed_in(browser, live_server, developer, viewport=LAPTOP)
    laptop.goto(f"{live_server.url}/")
    assert laptop.locator("#id_q").is_visible()  # open on a wide screen
