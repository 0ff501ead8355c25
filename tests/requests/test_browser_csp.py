"""Under the Content-Security-Policy (scripts from this origin only, config/settings.py), in headless Chromium: the
portal's behaviours that were inline handlers still work, the API documentation and the operator console render,
and the browser reports no violation on any of them."""

import pytest

from tests import factories
from tests.requests.test_browser import browser, signed_in  # noqa: F401 (the fixture)


def _violations(page) -> list[str]:
    """CSP violations the page reports from now on (Chromium logs each as a console error)."""
    seen: list[str] = []
    page.on("console", lambda message: "Content Security Policy" in message.text and seen.append(message.text))
    return seen


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_portal_the_api_docs_and_the_console_work_without_a_csp_violation(browser, live_server, shop, team):  # noqa: F811
    second = factories.project(name="Second project")
    factories.member(second, user=team.developer)
    page = signed_in(browser, live_server, team.developer)
    violations = _violations(page)

    page.goto(f"{live_server.url}/")
    page.select_option("#project-select", str(second.pk))  # submits the filter form on change
    page.wait_for_url(f"**/?project={second.pk}**")
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector(".swagger-ui .info")  # Swagger UI started from its own script file

    console = signed_in(browser, live_server, team.operator)
    violations += _violations(console)
    console.goto(f"{live_server.url}/admin/requests/resourcerequest/")
    console.wait_for_selector("#changelist")

    assert violations == []
