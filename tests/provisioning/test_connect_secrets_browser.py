"""Issue 37 item 3 in headless Chromium: the requester's Connect panel shows the Jupyter URL with their token and
changes it behind a confirmation dialog; a teammate's shows the URL without it."""

import pytest

from provisioning.connect import connect_secrets_shown
from requests.models import ResourceRequest
from tests.requests.test_browser import browser, signed_in  # noqa: F401  (fixture)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_requester_sees_and_changes_the_token_a_teammate_never_sees_it(browser, live_server, compute):  # noqa: F811
    request = compute.order()
    token = connect_secrets_shown(request, request.requester)["jupyter"]["secret"]
    url = f"{live_server.url}/requests/{request.pk}/"

    developer = signed_in(browser, live_server, request.requester)
    developer.goto(url)
    assert f"?token={token}" in developer.inner_text("#connect [data-access=jupyter]")
    developer.click("#rotate-jupyter")  # asks first, in a dialog
    dialog = developer.wait_for_selector("#confirm-dialog[open]")
    assert "Change the Jupyter token?" in dialog.inner_text()
    developer.click("#confirm-submit")
    developer.wait_for_selector("text=every sign-in made with it, no longer works")
    new = connect_secrets_shown(ResourceRequest.objects.get(pk=request.pk), request.requester)["jupyter"]["secret"]
    assert new != token and f"?token={new}" in developer.inner_text("#connect [data-access=jupyter]")

    teammate = signed_in(browser, live_server, compute.team.developer2)
    teammate.goto(url)
    jupyter = teammate.inner_text("#connect [data-access=jupyter]")
    assert "token" not in jupyter.split("\n")[0] and "only they see" in jupyter
    assert new not in teammate.content() and teammate.locator("#rotate-jupyter").count() == 0
