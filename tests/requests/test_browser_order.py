"""The catalog leading into a ready order, in headless Chromium (Debian's package, driven by Playwright): a
prefilled order previewed on load with a working "updating…", a refusal at its field with the focus on the
summary, and no horizontal scroll on a phone."""

import pytest

from tests.requests.test_browser import (  # noqa: F401 (the fixture)
    LAPTOP,
    PHONE,
    browser,
    horizontal_overflow,
    signed_in,
)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_catalog_option_opens_the_order_with_it_chosen_and_previewed(browser, live_server, shop, team):  # noqa: F811
    page = signed_in(browser, live_server, team.developer)
    page.click(f"a:text-is('{shop.sliced.name}')")
    page.wait_for_url(f"**/order/{shop.service.slug}/?**")
    assert page.input_value("#id_spec") == str(shop.sliced.pk)
    assert "0.50" in page.inner_text("#preview-cost")  # before anything was changed
    held = []
    page.route("**/preview/", lambda route: held.append(route))  # held: the indicator shows while it runs
    page.fill("#id_duration_hours", "30")
    page.press("#id_duration_hours", "Tab")  # the field's change event
    page.wait_for_selector("#preview-loading", state="visible")
    # The form previews on change and on keyup after 500 ms: Tab may start a second preview, so let every one go
    # (unroute lets go of any held after these, and would itself have handled these: continue them first).
    for route in held:
        route.continue_()
    page.unroute("**/preview/")
    page.wait_for_selector("#preview-loading", state="hidden")
    assert "for 30 h" in page.inner_text("#preview-cost")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_refusal_is_shown_at_its_field_and_the_summary_takes_the_focus(browser, live_server, shop, team):  # noqa: F811
    page = signed_in(browser, live_server, team.developer)
    page.goto(f"{live_server.url}/order/{shop.service.slug}/?project={team.project.pk}")
    page.check("input[name=over_quota][value=exception]")
    page.click("text=Submit request")
    page.wait_for_selector("#error-summary")
    assert page.evaluate("document.activeElement.id") == "error-summary"
    assert "A quota exception needs a justification." in page.inner_text("#id_justification ~ .errorlist")
    assert "justification_required" not in page.inner_text("main")
    page.click("#error-summary a[href='#id_justification']")
    assert page.evaluate("document.activeElement.id") == "id_justification"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_catalog_and_order_pages_do_not_scroll_sideways_on_a_phone(browser, live_server, shop, team):  # noqa: F811
    page = signed_in(browser, live_server, team.developer, viewport=PHONE)
    assert horizontal_overflow(page) == 0, "catalog"
    page.goto(f"{live_server.url}/?vendor=nvidia&fits_quota=on")
    assert horizontal_overflow(page) == 0, "filtered catalog"
    page.goto(f"{live_server.url}/order/{shop.service.slug}/?spec={shop.whole.pk}")
    page.wait_for_selector("#preview-cost")
    assert horizontal_overflow(page) == 0, "order"
