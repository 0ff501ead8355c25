"""The metering console: read-only changelists in constant queries, and the usage report for operators."""

from datetime import timedelta

import pytest

from metering import services
from metering.models import TelemetrySample
from tests import factories
from tests.metering.conftest import at, bound, use
from tests.metering.test_books import books_of
from tests.queries import queries_for
from tests.scheduling.inventory_helpers import node

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("frozen")]

CHANGELISTS = [
    "/admin/metering/telemetrysample/",
    "/admin/metering/dailyusage/",
    "/admin/metering/budgetalert/",
    "/admin/metering/slurmbooks/",
]
REPORT = "/admin/metering/dailyusage/report/"


def rows(world, roles, eight_cards):
    """Telemetry, daily rollups, budget alerts and Slurm's books of one more project."""
    project = factories.project()
    use(world, project, eight_cards, world.service)
    [device] = node(devices=1, model=world.model).devices.all()
    running = bound(world, spec=world.half, project=project, started=at("2026-11-20 08:00"), devices=[device])
    TelemetrySample.objects.bulk_create(
        TelemetrySample(
            allocation=running,
            device=device,
            sampled_at=at("2026-11-20 11:00") + timedelta(minutes=minute),
            utilization_pct=50,
            memory_used_mb=1000,
            power_w=200,
        )
        for minute in range(3)
    )
    books_of(
        bound(world, project=project, started=at("2026-11-19 08:00"), released=at("2026-11-19 09:00")),
        slurm=3,
        platform=2,
    )
    services.usage_refresh()


@pytest.mark.parametrize("url", CHANGELISTS)
def test_changelist_query_count_does_not_grow_with_rows(console, world, roles, eight_cards, url):
    rows(world, roles, eight_cards)
    console.get(url)
    few = queries_for(console, url)
    for _ in range(3):
        rows(world, roles, eight_cards)
    assert queries_for(console, url) == few


@pytest.mark.parametrize("url", CHANGELISTS)
def test_nothing_is_added_or_edited_here(console, url):
    assert console.get(f"{url}add/").status_code == 403


def test_operators_get_the_usage_report_with_the_portal_figures(console, usage):
    page = console.get(REPORT, {"project": usage.project.pk})
    assert page.status_code == 200
    body = page.content.decode()
    assert body.count('class="card chart"') == 4 and "Budget burn-down of" in body
    assert "8x Test H100 80GB requested 3 times" in body
    assert 'id="usage-report-link"' in console.get("/admin/metering/dailyusage/").content.decode()


def test_report_query_count_does_not_grow_with_rows(console, world, roles, eight_cards):
    rows(world, roles, eight_cards)
    console.get(REPORT)
    few = queries_for(console, REPORT)
    for _ in range(3):
        rows(world, roles, eight_cards)
    assert queries_for(console, REPORT) == few


def test_developers_get_no_console(client, roles):
    client.force_login(roles.developer)
    assert client.get(REPORT).status_code == 302
    assert client.get(CHANGELISTS[0]).status_code == 302
