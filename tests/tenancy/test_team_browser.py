"""In headless Chromium: a lead adds a member and invites a newcomer, who signs up from the mail's link."""

import re

import pytest

from tenancy.choices import Role
from tenancy.models import Membership, User
from tests import factories
from tests.requests.test_browser import browser, signed_in  # noqa: F401 (the fixture)
from tests.smtp_server import text_of


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_lead_adds_a_member_and_invites_someone_who_signs_up_from_the_mail(
    browser,  # noqa: F811
    live_server,
    roles,
    mailbox,
    settings,
):
    settings.PUBLIC_BASE_URL = live_server.url  # the mail's link leads to this server
    colleague = factories.UserFactory(first_name="Ada", last_name="Lovelace")
    factories.member(factories.project(tenant_obj=roles.project.tenant), user=colleague)  # of the lead's tenant
    lead = signed_in(browser, live_server, roles.lead)
    lead.goto(f"{live_server.url}/projects/")
    lead.click(f"tr:has-text('{roles.project.name}') >> text=Team")
    lead.wait_for_selector("#team-add")

    lead.fill("#id_identifier", colleague.username)
    lead.select_option("#id_role", Role.MEMBER)
    lead.click("#team-add button[type=submit]")
    lead.wait_for_selector(f"text={colleague.username} is now member.")
    assert lead.locator(f"#team tr[data-user={colleague.username}][data-role=member]").count() == 1
    assert Membership.objects.get(project=roles.project, user=colleague).role == Role.MEMBER

    lead.select_option(f"#role-{colleague.pk}", Role.APPROVER)
    lead.click(f"#team tr[data-user={colleague.username}] >> text=Change")
    lead.wait_for_selector(f"#team tr[data-user={colleague.username}][data-role=approver]")

    lead.fill("#id_identifier", "grace@example.org")
    lead.click("#team-add button[type=submit]")
    lead.wait_for_selector("text=Invitation sent to grace@example.org.")
    assert lead.locator("#invitations tr[data-email='grace@example.org']").count() == 1
    lead.reload()  # every POST answered with a redirect: a reload sends nothing again
    assert lead.locator("#invitations tr").count() == 2  # header and the one invitation

    [mail] = mailbox.wait_for(1)
    assert mail["To"] == "grace@example.org"
    link = re.search(r"(http://\S+/invitations/\S+/)", text_of(mail)).group(1)

    newcomer = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    newcomer.goto(link)
    newcomer.fill("#id_username", "grace")
    newcomer.fill("#id_first_name", "Grace")
    newcomer.fill("#id_password", "compilers-since-1952")
    newcomer.fill("#id_password_again", "compilers-since-1952")
    newcomer.click("text=Create my account")
    newcomer.wait_for_selector(f"text=Welcome! You are now member of {roles.project.name}.")
    assert "Order compute" in newcomer.inner_text("h1")  # a member may order: the catalog leads into orders
    grace = User.objects.get(username="grace")
    assert Membership.objects.get(project=roles.project, user=grace).role == Role.MEMBER

    asked = []
    lead.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))  # the removal asks first
    lead.reload()
    assert lead.locator("#invitations").count() == 0  # accepted: no longer waiting
    lead.click("#team tr[data-user=grace] >> text=Remove")
    lead.wait_for_selector("text=grace was removed")
    assert asked == [f"Remove grace from {roles.project.name}? They lose access to its requests at once."]
    assert not Membership.objects.filter(project=roles.project, user=grace).exists()


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_team_page_fits_a_phone(browser, live_server, roles):  # noqa: F811
    for _ in range(3):
        factories.member(roles.project, user=factories.UserFactory(first_name="Maximiliane", last_name="Longname"))
    page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", roles.lead.username)
    page.fill("#id_password", factories.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
    page.goto(f"{live_server.url}/projects/{roles.project.pk}/team/")
    page.wait_for_selector("#team-add")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
