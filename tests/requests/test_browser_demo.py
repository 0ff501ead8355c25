"""Issue 39's "done when": the demo as a newcomer meets it (seed_demo's catalog, cluster, rules and people), in
headless Chromium. `developer` orders each demo offering from its default order form, untouched: the GPU workspace,
a MIG slice, the bare-metal server and the model-serving endpoint (llama.cpp where `make llama` installed it, the
stand-in server otherwise); the routed approvers approve from their inboxes; each request becomes active with no
refusal and no failure on the way, and is released.

With SCREENSHOTS=<directory> (`make screenshots`) it also writes the README's walk-through screenshots there, each
reduced with pngquant."""

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

from provisioning.runtimes import local_serving_runtimes
from requests.models import ResourceRequest
from serving.models import ServingReplica
from tenancy.demo import DEMO_PASSWORD_DEFAULT
from tests.requests.test_browser import browser  # noqa: F401 (the fixture)

SCREENSHOTS = os.environ.get("SCREENSHOTS", "")
VIEWPORT = {"width": 1180, "height": 760}
SLOW = 60_000  # ms: a serving order's approval waits for its model to load (inline: tasks run synchronously here)


@pytest.fixture
def demo(transactional_db, settings):
    """The demo's data, as `make run` seeds it; inference servers the orders start are stopped at the end."""
    call_command("seed_demo", force=True, stdout=open(os.devnull, "w"))  # noqa: SIM115 - closed at exit
    settings.PROVISIONING_SIMULATED_SPEED = 0
    yield
    for pid in ServingReplica.objects.exclude(pid=None).values_list("pid", flat=True):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sign_in(browser, live_server, username):  # noqa: F811
    page = browser.new_context(viewport=VIEWPORT).new_page()
    page.set_default_timeout(SLOW)
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", os.environ.get("DEMO_PASSWORD") or DEMO_PASSWORD_DEFAULT)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
    return page


def shoot(page, name: str) -> None:
    """A walk-through screenshot when SCREENSHOTS names a directory: the viewport, palette-reduced by pngquant."""
    if not SCREENSHOTS:
        return
    assert shutil.which("pngquant"), "make screenshots installs pngquant (Debian's package)"
    path = Path(SCREENSHOTS) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), animations="disabled")
    subprocess.run(["pngquant", "--force", "--quality=50-80", "--speed=1", "--output", path, path], check=True)


def submitted_from_the_default_form(page, what: str, screenshot: str = "") -> int:
    """Submit the order form as it opened (previewed on load), after checking the preview refuses nothing."""
    page.wait_for_selector("#preview-cost")
    assert page.locator("#preview-refusal, #preview-quota-reasons").count() == 0, page.inner_text("#preview")
    placement = page.inner_text("#preview-placement")
    assert "fits now" in placement, f"{what}: {placement}"
    if screenshot:
        shoot(page, screenshot)
    page.click("text=Submit request")
    page.wait_for_selector("#request-state")
    assert page.locator("#error-summary").count() == 0, page.inner_text("main")
    return int(re.search(r"/requests/(\d+)/", page.url).group(1))


def approve(browser, live_server, username: str, request_id: int, screenshot: str = "") -> None:  # noqa: F811
    page = sign_in(browser, live_server, username)
    page.goto(f"{live_server.url}/approvals/")
    row = page.locator("#inbox tbody tr", has=page.locator(f"a[href='/requests/{request_id}/']"))
    assert "can't place" not in row.inner_text()
    if screenshot:
        shoot(page, screenshot)
    row.locator("textarea").fill("Approved for the walk-through")
    row.locator("button[value=approve]").click()
    page.wait_for_load_state()
    assert page.locator(f"#inbox a[href='/requests/{request_id}/']").count() == 0
    page.context.close()


def active(page, live_server, request_id: int, screenshot: str = "") -> None:
    """The request's page shows it active, every provisioning step succeeded, nothing failed."""
    page.goto(f"{live_server.url}/requests/{request_id}/")
    page.wait_for_selector("#request-state >> text=Active")
    assert page.locator("#connect").count() == 1
    assert page.locator("#failure, #provisioning [data-state=failed], .run-failure").count() == 0
    assert ResourceRequest.objects.get(pk=request_id).events.filter(code__in=["failed", "rejected"]).count() == 0
    if screenshot:
        shoot(page, screenshot)


def released(page) -> None:
    page.click("#release")
    page.wait_for_selector("#confirm-dialog[open]")
    page.click("#confirm-submit")
    page.wait_for_selector("#request-state >> text=Released")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_developer_orders_every_demo_offering_from_its_default_form_and_each_becomes_active(
    browser,  # noqa: F811
    live_server,
    demo,
):
    developer = sign_in(browser, live_server, "developer")
    shoot(developer, "catalog")

    # The GPU workspace: the project approver decides.
    developer.click("a.button:text-is('Order NVIDIA GPU workspace')")
    workspace = submitted_from_the_default_form(developer, "workspace")
    developer.wait_for_selector("#request-state >> text=Pending approval")
    approve(browser, live_server, "approver", workspace)
    active(developer, live_server, workspace)
    released(developer)

    # A MIG slice, from its row in the catalog: small slices are self-service.
    developer.goto(f"{live_server.url}/")
    developer.click("a:text-is('H100 MIG 1g.10gb, 4 vCPU, 32 GiB')")
    mig_slice = submitted_from_the_default_form(developer, "mig-slice")
    active(developer, live_server, mig_slice)
    assert "MIG 1g.10gb" in developer.inner_text("#timeline")
    released(developer)

    # The bare-metal server: the project lead, then the operators.
    developer.goto(f"{live_server.url}/")
    developer.click("a.button:text-is('Order Bare-metal HGX H100 server')")
    server = submitted_from_the_default_form(developer, "bare-metal")
    approve(browser, live_server, "lead", server)
    approve(browser, live_server, "operator", server)
    active(developer, live_server, server, screenshot="request-bare-metal")
    released(developer)

    # The model-serving endpoint: what the demo's nodes really run (reported by seed_demo's probe).
    developer.goto(f"{live_server.url}/")
    developer.click("a.button:text-is('Order LLM inference endpoint')")
    developer.wait_for_selector("#preview-cost")
    template = developer.locator("#id_serving_template option:checked").inner_text()
    assert "cannot run here" not in template
    endpoint = submitted_from_the_default_form(developer, "endpoint", screenshot="order-endpoint")
    approve(browser, live_server, "approver", endpoint, screenshot="approval-inbox")
    active(developer, live_server, endpoint, screenshot="request-endpoint")
    assert "/serve/" in developer.inner_text("#connect")
    runtime = ResourceRequest.objects.get(pk=endpoint).approved_spec["serving"]["runtime"]
    assert runtime == ("llamacpp" if local_serving_runtimes().get("llamacpp") else "simulated")
    released(developer)
