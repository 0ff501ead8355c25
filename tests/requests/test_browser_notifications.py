"""In headless Chromium: what people do in the browser reaches others by mail, through a real SMTP server."""

import pytest

from requests import services as request_services
from requests.choices import ApprovalMode, NotificationKind, RequestState
from requests.notifications import preferences_of
from tests.requests.conftest import approval_rule, approver_stage, make_order
from tests.requests.test_browser import browser, signed_in  # noqa: F401 (the fixture)
from tests.smtp_server import html_of, text_of


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_an_approval_in_the_browser_mails_the_requester(browser, live_server, shop, team, mailbox):  # noqa: F811
    approval_rule(approver_stage(mode=ApprovalMode.ANY))
    request = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    assert request.state == RequestState.PENDING_APPROVAL

    approver = signed_in(browser, live_server, team.approver)
    approver.goto(f"{live_server.url}/approvals/")
    row = approver.locator("#inbox tbody tr").first
    row.locator("textarea").fill("Go ahead")
    row.locator("button[value=approve]").click()
    approver.wait_for_selector("text=Nothing is waiting for your decision.")

    [mail] = mailbox.wait_for(1)
    assert mail["To"] == team.developer.email
    assert mail["Subject"] == f"Request #{request.pk} approved"
    assert f"https://compute.example.org/requests/{request.pk}/" in text_of(mail)
    assert f"Approved by {team.approver.username}" in html_of(mail)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_developer_turns_a_kind_off_in_the_browser_and_no_longer_gets_it(
    browser,  # noqa: F811
    live_server,
    shop,
    team,
    mailbox,
):
    developer = signed_in(browser, live_server, team.developer)
    developer.click("nav >> text=Notifications")
    developer.uncheck("#kind-request_rejected")
    developer.click("#notification-preferences button[type=submit]")
    developer.wait_for_selector("text=Notification settings saved.")
    assert developer.is_checked("#kind-request_approved") and not developer.is_checked("#kind-request_rejected")
    assert developer.locator("#kind-approval_digest").count() == 0  # not an approver
    assert preferences_of(team.developer)[NotificationKind.REQUEST_REJECTED] is False

    approval_rule(approver_stage(mode=ApprovalMode.ANY))
    rejected = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    approved = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    approver = signed_in(browser, live_server, team.approver)
    approver.goto(f"{live_server.url}/approvals/")
    for request, decision in ((rejected, "reject"), (approved, "approve")):
        row = approver.locator(f"#inbox tbody tr:has-text('#{request.pk}')").first
        row.locator("textarea").fill("decided")
        row.locator(f"button[value={decision}]").click()
        approver.wait_for_load_state()
    [mail] = mailbox.wait_for(1)
    assert mail["Subject"] == f"Request #{approved.pk} approved"
    assert len(mailbox.messages) == 1
