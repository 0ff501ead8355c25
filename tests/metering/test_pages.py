"""The usage page and the order form's rightsizing hint: who sees what, the charts, query counts."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from metering import services
from metering.models import IdleWatch
from tests import factories
from tests.metering.conftest import at, bound, use

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("frozen")]

PAGE = "/usage/"


def page_of(client, user, query=None) -> str:
    client.force_login(user)
    response = client.get(PAGE, query or {})
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def test_anonymous_visitors_are_sent_to_sign_in(client):
    response = client.get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


MATRIX = [
    ("developer", ["home"]),
    ("approver", ["home"]),
    ("other_developer", ["other"]),
    ("operator", ["home", "other"]),
    ("outsider", []),
]


@pytest.mark.parametrize(("who", "sees"), MATRIX, ids=[who for who, _ in MATRIX])
def test_each_role_sees_only_the_projects_it_may_view(client, usage, who, sees):
    page = page_of(client, getattr(usage, who))
    projects = {"home": usage.project, "other": usage.other_project}
    for name, project in projects.items():
        # Spelled one way wherever the page names it (per project, its budget row): as the filter spells it.
        assert page.count(f"<td>{project}</td>") == (2 if name in sees else 0)
        assert f"<td>{project.slug}</td>" not in page and f"{project.tenant.slug} / " not in page


def test_page_has_charts_budgets_advice_kpi_and_a_csv_link(client, usage):
    page = page_of(client, usage.developer)
    assert page.count('class="card chart"') == 3  # card-hours, cost, energy per month
    assert "Card-hours per month" in page and "Energy per month" in page
    assert "Warning share of the monthly budget used" in page  # 4 of 4.5 card-hours
    assert "8x Test H100 80GB requested 3 times in 30 days" in page
    kpi_row = r"<td[^>]*>2026-11</td><td[^>]*>[^<]+</td><td class=\"num\"[^>]*>1</td><td class=\"num\"[^>]*>1</td>"
    assert re.search(kpi_row, page)
    assert 'href="/api/v1/usage/export/?group_by=project%2Ctenant%2Caccelerator_model%2Cspec%2Cmonth' in page
    assert 'aria-current="page">Usage</a>' in page


def test_choosing_a_project_adds_its_budget_burn_down(client, usage):
    page = page_of(client, usage.developer, {"project": usage.project.pk, "from": "2026-11", "to": "2026-11"})
    assert page.count('class="card chart"') == 4 and 'id="burn-down"' in page
    actual = re.search(r'<polyline points="([^"]+)" fill="none" stroke="#c05621"', page).group(1)
    assert len(actual.split()) == 20  # November 1st to 20th
    assert "&amp;project=" in page  # the CSV link keeps the filter


def test_a_project_one_may_not_see_is_a_form_error(client, usage):
    client.force_login(usage.developer)
    response = client.get(PAGE, {"project": usage.other_project.pk})
    assert response.status_code == 400 and "Select a valid choice" in response.content.decode()


@pytest.mark.parametrize("query", [{"from": "2026-13"}, {"from": "2026-11", "to": "2026-01"}])
def test_bad_months_are_refused_with_the_reason(client, roles, query):
    client.force_login(roles.developer)
    response = client.get(PAGE, query)
    assert response.status_code == 400
    assert "YYYY-MM" in response.content.decode() or "comes after" in response.content.decode()


@pytest.mark.parametrize("who", ["developer", "operator"])
def test_query_count_does_not_grow_with_rows(client, world, roles, eight_cards, who):
    use(world, roles.project, eight_cards, world.service)
    services.usage_refresh()
    client.force_login(getattr(roles, who))
    client.get(PAGE)  # warm caches

    def measured() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(PAGE).status_code == 200
        return len(queries)

    few = measured()
    for _ in range(4):
        project = factories.project()
        factories.member(project, user=roles.developer)
        use(world, project, eight_cards, factories.ServiceFactory(specs=[world.whole], images=[world.image]))
    services.usage_refresh()
    assert measured() == few


def _preview(client, usage, project, spec) -> str:
    data = {
        "project": project.pk,
        "spec": spec.pk,
        "image": usage.world.image.pk,
        "duration_hours": 10,
        "priority": "standard",
        "environment": "development",
        "parameters": "",
        "justification": "",
        "over_quota": "reject",
    }
    response = client.post(f"/order/{usage.world.service.slug}/preview/", data)
    assert response.status_code == 200
    return response.content.decode()


def test_the_order_form_shows_the_projects_rightsizing_hint_for_the_chosen_spec(client, usage, eight_cards):
    client.force_login(usage.developer)
    hint = _preview(client, usage, usage.project, eight_cards.eight)
    assert 'id="preview-rightsizing"' in hint
    assert "8x Test H100 80GB requested 3 times in 30 days" in hint and "1x Test H100 80GB or 3g.40gb" in hint
    assert "preview-rightsizing" not in _preview(client, usage, usage.project, usage.world.whole)
    fresh = factories.project()
    factories.member(fresh, user=usage.developer)
    assert "preview-rightsizing" not in _preview(client, usage, fresh, eight_cards.eight)  # no evidence there


def test_choosing_a_project_filters_every_table_tokens_and_zero_touch_included(client, usage):
    from datetime import date

    from metering.models import TokenUsage
    from requests.models import ResourceRequest

    for project, model in ((usage.project, "model-of-home"), (usage.other_project, "model-of-other")):
        request = ResourceRequest.objects.filter(project=project).first()
        TokenUsage.objects.create(
            request=request, project=project, model=model, key_prefix="k", day=date(2026, 11, 5), requests=1
        )
    operator = factories.operator()
    everything = page_of(client, operator, {"from": "2026-11", "to": "2026-11"})
    assert "model-of-home" in everything and "model-of-other" in everything
    one = page_of(client, operator, {"project": usage.project.pk, "from": "2026-11", "to": "2026-11"})
    assert "model-of-home" in one and "model-of-other" not in one
    kpi = one[one.index('id="zero-touch-table"') : one.index('id="tokens"')]
    assert usage.other_service.name not in kpi  # the other project's delivery is not counted here
    assert usage.other_service.name in everything[everything.index('id="zero-touch-table"') :]


def test_idle_card_hours_per_project_and_request_in_a_fixed_number_of_queries(client, world, roles):
    def held_four_idle_one(project):
        allocation = bound(world, project=project, started=at("2026-11-10 08:00"), released=at("2026-11-10 10:00"))
        IdleWatch.objects.create(request=allocation.request, idle_card_seconds=3600)  # an ended episode: 1 card-hour
        return allocation.request

    request = held_four_idle_one(roles.project)
    services.usage_refresh()
    client.force_login(roles.developer)
    client.get(PAGE)  # warm caches

    def measured() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(PAGE)
        assert response.status_code == 200
        return len(queries), response.content.decode()

    few, page = measured()
    [project_row] = re.findall(r'<table id="idle-by-project".*?<tbody>(.*?)</tbody>', page, re.S)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", project_row)
    assert cells == [str(roles.project), "4", "3", "1", "25.0%"]
    assert f'<a href="/requests/{request.pk}/">#{request.pk}</a>' in page
    for _ in range(4):
        project = factories.project()
        factories.member(project, user=roles.developer)
        held_four_idle_one(project)
    services.usage_refresh()
    assert measured()[0] == few
