"""In headless Chromium: a person signs in through the company IdP's page (oidc-provider-mock), lands in the catalog
with the project their group grants; taken out of the group, the next sync takes it away and their token answers 401."""

import pytest

from devcluster.oidc_provider import PEOPLE
from tenancy import tasks
from tenancy.choices import GroupGrant
from tenancy.models import GroupMapping, User
from tests import factories
from tests.requests.test_browser import LAPTOP, browser  # noqa: F401 (the fixture)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_person_signs_in_with_the_idp_gets_their_groups_projects_and_loses_them_when_removed(
    browser,  # noqa: F811
    live_server,
    idp,
    api,
):
    research = factories.project(name="Deep Research", slug="deep-research")
    factories.project(name="Sales Forecasts", slug="sales")  # no group gives alice this one
    GroupMapping.objects.create(
        group="research", grant=GroupGrant.PROJECT_MEMBER, project=research, written_by=factories.operator()
    )
    page = browser.new_context(viewport=LAPTOP).new_page()
    page.set_default_timeout(10_000)

    page.goto(f"{live_server.url}/accounts/login/")
    page.click("text=Sign in with Example SSO")
    page.wait_for_url(lambda url: url.startswith(idp.url))
    page.fill("input[name=sub]", "alice")
    page.click("button:has-text('Authorize')")
    page.wait_for_url(f"{live_server.url}/")

    catalog = page.inner_text("main")
    assert "Deep Research" in catalog and "Sales Forecasts" not in catalog
    assert "Sign out Alice Archer" in page.inner_text("header")
    alice = User.objects.get(username="alice")
    secret = factories.token_for(alice)  # as her personal tokens page issues one
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert [project["slug"] for project in api.get("/api/v1/projects/").json()["results"]] == ["deep-research"]

    idp.set_person("alice", {**PEOPLE["alice"], "groups": ["ml-engineers"]})  # taken out of research
    report = tasks.sync_directory()

    assert report["removed"] == 1
    assert api.get("/api/v1/projects/").status_code == 401
    page.reload()
    assert "Deep Research" not in page.inner_text("main")
