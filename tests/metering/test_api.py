"""The usage API: who sees what (role matrix over every endpoint), the figures, validation, CSV, query counts."""

import csv
import io
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from metering import services
from tests import factories
from tests.metering.conftest import use

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("frozen")]

REPORT, EXPORT, BUDGETS = "/api/v1/usage/", "/api/v1/usage/export/", "/api/v1/usage/budgets/"
RECOMMENDATIONS, ZERO_TOUCH = "/api/v1/usage/recommendations/", "/api/v1/usage/zero-touch/"
IDLE = "/api/v1/usage/idle/"
ENDPOINTS = [REPORT, EXPORT, BUDGETS, RECOMMENDATIONS, ZERO_TOUCH, IDLE]


def projects_in(url: str, response, roles) -> list[str]:
    """The projects an answer is about, whatever its shape."""
    assert response.status_code == 200, response.content
    if url == EXPORT:
        return sorted(row["project"] for row in csv.DictReader(io.StringIO(response.content.decode())))
    body = response.json()
    rows = body["results"] if url == REPORT else body["projects"] if url == IDLE else body
    if url == ZERO_TOUCH:
        services_of = {roles.world.service.slug: roles.project.slug, roles.other_service.slug: roles.other_project.slug}
        return sorted(services_of[row["service"]] for row in rows)
    return sorted(row["project"] for row in rows)


@pytest.mark.parametrize("url", ENDPOINTS)
def test_anonymous_is_refused_in_the_error_shape(api, url):
    response = api.get(url)
    assert response.status_code == 401
    assert set(response.json()) == {"code", "message", "details"}


MATRIX = [
    ("developer", ["home"]),
    ("approver", ["home"]),
    ("other_developer", ["other"]),
    ("operator", ["home", "other"]),
    ("outsider", []),
]


@pytest.mark.parametrize("url", ENDPOINTS)
@pytest.mark.parametrize(("who", "sees"), MATRIX, ids=[who for who, _ in MATRIX])
def test_each_role_sees_only_the_projects_it_may_view(api_as, usage, url, who, sees):
    slugs = {"home": usage.project.slug, "other": usage.other_project.slug}
    response = api_as(getattr(usage, who)).get(url, {"group_by": "project"} if url in (REPORT, EXPORT) else {})
    seen = [slug for slug in projects_in(url, response, usage) if slug in slugs.values()]  # operators see more
    assert seen == sorted(slugs[name] for name in sees)


def test_report_figures_by_project_and_month(api_as, usage):
    client = api_as(usage.developer)
    body = client.get(REPORT, {"from": "2026-11"}).json()
    assert (body["from"], body["to"], body["group_by"]) == ("2026-11", "2026-11", ["project", "month"])
    assert body["results"] == [
        {
            "project": usage.project.slug,
            "month": "2026-11",
            "card_hours": "4.0000",
            "cost": "16.00",
            "currency": "USD",
            "energy_kwh": 0.0,
        }
    ]  # 2 h x 2 cards at 4.00
    [october] = client.get(REPORT, {"from": "2026-10", "to": "2026-10"}).json()["results"]
    assert (october["card_hours"], october["cost"], october["energy_kwh"]) == (
        "552.0000",
        "2152.80",
        37.5,
    )  # 3 days x 23 h x 8 cards at 3.90; 12.5 kWh a day


def test_report_grouped_by_every_key_and_filtered(api_as, usage):
    rows = (
        api_as(usage.operator)
        .get(REPORT, {"group_by": "tenant,accelerator_model,spec,request,month", "project": usage.project.pk})
        .json()["results"]
    )
    assert {row["tenant"] for row in rows} == {usage.project.tenant.slug}
    assert {row["accelerator_model"] for row in rows} == {usage.world.model.slug}
    assert all(
        set(row)
        == {"tenant", "accelerator_model", "spec", "request", "month", "card_hours", "cost", "currency", "energy_kwh"}
        | {"nodes", "members"}  # by request: how many nodes it ran on at once, a multi-node one's members
        for row in rows
    )
    assert {(row["nodes"], tuple(row["members"])) for row in rows} == {(1, ())}
    by_tenant = api_as(usage.operator).get(REPORT, {"group_by": "project", "tenant": usage.other_project.tenant_id})
    assert [row["project"] for row in by_tenant.json()["results"]] == [usage.other_project.slug]


@pytest.mark.parametrize(
    "query",
    [
        {"group_by": "project,colour"},
        {"group_by": ","},
        {"from": "2026-13"},
        {"from": "2026-11", "to": "2026-10"},
        {"from": "2020-01", "to": "2026-11"},
        {"project": "x"},
    ],
)
def test_bad_queries_are_400_validation_errors(api_as, roles, query):
    response = api_as(roles.developer).get(REPORT, query)
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"


def test_export_is_csv_with_the_grouping_as_columns(api_as, usage):
    response = api_as(usage.operator).get(EXPORT, {"group_by": "project,spec,month", "from": "2026-11"})
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="usage-2026-11-2026-11.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["project", "spec", "month", "card_hours", "cost", "currency", "energy_kwh"]
    assert [usage.project.slug, usage.world.whole.slug, "2026-11", "4.0000", "16.00", "USD", "0.0"] in rows


def test_budgets_show_use_limit_and_the_alerts_raised(api_as, usage):
    [budget] = api_as(usage.developer).get(BUDGETS).json()
    assert {key: budget[key] for key in ("project", "month", "limit", "used", "used_pct", "level")} == {
        "project": usage.project.slug,
        "month": "2026-11",
        "limit": "4.50",
        "used": "4.0000",
        "used_pct": 88.9,
        "level": "warning",
    }
    assert [alert["level"] for alert in budget["alerts"]] == ["warning"]
    assert Decimal(budget["projected"]) >= Decimal(4)


def test_recommendations_carry_evidence_and_suggestions(api_as, usage):
    [advice] = api_as(usage.developer).get(RECOMMENDATIONS, {"project": usage.project.pk}).json()
    assert advice["requests"] == 3 and advice["p95_memory_gb"] == 20.0
    assert [suggestion["label"] for suggestion in advice["suggestions"]] == ["1x Test H100 80GB", "3g.40gb"]
    assert advice["message"].startswith("8x Test H100 80GB requested 3 times in 30 days")
    assert api_as(usage.developer).get(RECOMMENDATIONS, {"project": usage.other_project.pk}).json() == []


def test_zero_touch_rows(api_as, usage):
    [row] = api_as(usage.developer).get(ZERO_TOUCH).json()
    assert row == {
        "service": usage.world.service.slug,
        "service_name": usage.world.service.name,
        "month": "2026-11",
        "delivered": 1,
        "zero_touch": 1,
        "interventions": 0,
        "zero_touch_pct": 100.0,
    }


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(
            url, {"group_by": "project,tenant,accelerator_model,spec,month"} if url in (REPORT, EXPORT) else {}
        )
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize("url", ENDPOINTS)
def test_query_count_does_not_grow_with_rows(api_as, world, roles, eight_cards, url):
    client = api_as(roles.operator)
    use(world, roles.project, eight_cards, world.service)
    services.usage_refresh()
    client.get(url)  # warm per-process caches (content types, permissions)
    few = _queries(client, url)
    for _ in range(4):
        project = factories.project()
        use(world, project, eight_cards, factories.ServiceFactory(specs=[world.whole], images=[world.image]))
    services.usage_refresh()
    assert _queries(client, url) == few
