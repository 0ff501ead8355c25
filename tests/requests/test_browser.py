"""End to end in headless Chromium (Debian's package, driven by Playwright): order, approve, see it queued."""

import os
import shutil

import pytest
from django.db import connections

from requests.choices import ApprovalMode
from tests import factories
from tests.requests.conftest import approval_rule, approver_stage

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser(transactional_db):
    # After the database fixture: a transactional test restores the migrations' data (vendors, content types)
    # before it starts, which goes wrong once Playwright's event loop runs in this thread.
    # Playwright's sync API runs an event loop in this thread; the ORM calls in fixtures are still synchronous.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
        # While Playwright's loop runs here, Django keeps this thread's connections apart from the ones opened before
        # it started (asgiref's Local follows the async context): the test's teardown, after the loop, closes only
        # those, so the ones the test opened are closed here, or they outlive the session and block the test
        # database's drop.
        connections.close_all()


PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1440, "height": 900}


def signed_in(browser, live_server, user, viewport=LAPTOP):
    """A new page of its own browser context, signed in as the user."""
    page = browser.new_context(viewport=viewport).new_page()
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", factories.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)  # each role lands on its own page
    return page


def horizontal_overflow(page) -> int:
    """How many CSS pixels the page is wider than its viewport (0: no sideways scroll)."""
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_developer_orders_approver_approves_developer_sees_it_queued(browser, live_server, shop, team):
    approval_rule(approver_stage(mode=ApprovalMode.ANY))

    developer = signed_in(browser, live_server, team.developer)
    developer.click(f"text=Order {shop.service.name}")
    developer.select_option("#id_spec", str(shop.whole.pk))
    developer.fill("#id_duration_hours", "10")
    developer.fill("#id_justification", "Fine-tuning run")
    developer.wait_for_selector("#preview-cost >> text=for 10 h")  # the live preview follows the form
    developer.wait_for_selector("#preview-route >> text=Stage 1")
    assert "80.00" in developer.inner_text("#preview-cost")  # 2 cards x 4.00 x 10 h
    developer.click("text=Submit request")
    developer.wait_for_selector("#request-state >> text=Pending approval")
    request_url = developer.url

    approver = signed_in(browser, live_server, team.approver)
    approver.click("text=Approvals")
    row = approver.locator("#inbox tbody tr").first
    assert team.developer.username in row.inner_text()
    row.locator("textarea").fill("Looks right")
    row.locator("button[value=approve]").click()
    approver.wait_for_selector("text=Nothing is waiting for your decision.")

    developer.goto(request_url)
    developer.wait_for_selector("#request-state >> text=Queued")
    timeline = developer.inner_text("#timeline")
    for step in ("ordered", "Stage 1", "Approved by", "waiting for the scheduler"):
        assert step in timeline
    assert developer.locator("#timeline li[data-code=queued]").count() == 1


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_an_order_with_free_hardware_is_delivered_and_released_without_an_operator(browser, live_server, shop, team):
    from tests.provisioning.conftest import add_node

    add_node(shop.accelerator)
    developer = signed_in(browser, live_server, team.developer)
    developer.click(f"text=Order {shop.service.name}")
    developer.select_option("#id_spec", str(shop.whole.pk))
    developer.fill("#id_duration_hours", "4")
    developer.click("text=Submit request")
    developer.wait_for_selector("#request-state >> text=Active")  # approved, placed and provisioned meanwhile
    for step in ("prepare_image", "start_workload", "readiness_check", "publish_access"):
        assert developer.locator(f"#provisioning tr[data-step={step}][data-state=succeeded]").count() == 1
    assert "ssh -p" in developer.inner_text("#connect")  # how to connect comes first, once
    assert "GPU-n1-0" in developer.inner_text("#allocation")

    developer.click("#release")  # asks first, in a dialog, saying what it stops
    dialog = developer.wait_for_selector("#confirm-dialog[open]")
    assert "n1" in dialog.inner_text() and "2 devices" in dialog.inner_text()
    assert developer.locator("#request-state >> text=Active").count() == 1  # nothing happened yet
    developer.fill("#confirm-dialog #id_reason", "Finished")
    developer.click("#confirm-submit")
    developer.wait_for_selector("#request-state >> text=Released")
    assert developer.locator("#provisioning tr[data-step=return_capacity][data-state=succeeded]").count() == 1


def _submitted(developer, shop, hours="4"):
    developer.click(f"text=Order {shop.service.name}")
    developer.select_option("#id_spec", str(shop.whole.pk))
    developer.fill("#id_duration_hours", hours)
    developer.click("text=Submit request")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_request_page_turns_active_by_itself(browser, live_server, shop, team):
    from scheduling import cycle
    from tests.provisioning.conftest import add_node

    developer = signed_in(browser, live_server, team.developer)
    _submitted(developer, shop)
    developer.wait_for_selector("#request-state >> text=Queued")  # no hardware yet
    developer.evaluate("window.notReloaded = true")

    add_node(shop.accelerator)  # capacity arrives; the scheduler places and provisioning delivers
    cycle.run_cycle()

    developer.wait_for_selector("#request-state >> text=Active", timeout=15_000)
    assert developer.evaluate("window.notReloaded") is True  # the page followed the request without a reload
    assert "ssh -p" in developer.inner_text("#connect")
    assert developer.locator("#release").count() == 1 and developer.locator("#queue-status").count() == 0


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_request_page_fits_a_phone(browser, live_server, shop, team):
    from tests.provisioning.conftest import add_node

    add_node(shop.accelerator)
    desktop = signed_in(browser, live_server, team.developer)
    _submitted(desktop, shop)
    desktop.wait_for_selector("#request-state >> text=Active")
    phone = desktop.context.browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    phone.add_cookies(desktop.context.cookies())
    page = phone.new_page()
    page.goto(desktop.url)
    page.wait_for_selector("#connect")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
