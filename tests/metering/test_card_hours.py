"""Card-hours and cost from allocations' bound intervals, against hand-computed values."""

from datetime import date
from decimal import Decimal

import pytest

from metering.selectors import usage_report
from tests import factories
from tests.metering.conftest import at, bound

pytestmark = pytest.mark.django_db

NOVEMBER, OCTOBER = date(2026, 11, 1), date(2026, 10, 1)


def report(*group_by, first=NOVEMBER, last=NOVEMBER, now="2026-11-30 12:00", user=None):
    return usage_report(
        user=user or factories.operator(), first_month=first, last_month=last, group_by=list(group_by), now=at(now)
    )


def numbers(row) -> tuple:
    return row["card_hours"], row["cost"]


def test_whole_cards_count_one_each_for_their_bound_interval(world):
    bound(world, started=at("2026-11-02 10:00"), released=at("2026-11-02 13:30"))  # 2 cards x 3.5 h
    [row] = report("project", "month")
    assert (row["project"], row["month"]) == (world.project.slug, "2026-11")
    assert numbers(row) == (Decimal("7.0000"), Decimal("28.00"))  # 3.5 h x (2 cards x 4.00)


def test_a_slice_counts_as_its_fraction_of_a_card(world):
    bound(world, spec=world.half, started=at("2026-11-03 08:00"), released=at("2026-11-03 12:00"))
    [row] = report("spec")
    assert row["spec"] == world.half.slug
    assert numbers(row) == (Decimal("2.0000"), Decimal("2.00"))  # 0.5 card x 4 h; 4 h x 0.50


def test_an_allocation_over_the_turn_of_the_month_is_split_at_midnight(world):
    bound(world, started=at("2026-10-31 20:00"), released=at("2026-11-01 04:15"))
    rows = report("month", first=OCTOBER)
    assert [(row["month"], *numbers(row)) for row in rows] == [
        ("2026-10", Decimal("8.0000"), Decimal("32.00")),  # 4 h x 2 cards
        ("2026-11", Decimal("8.5000"), Decimal("34.00")),  # 4.25 h x 2 cards
    ]
    [november] = report("month")
    assert november["card_hours"] == Decimal("8.5000")


def test_a_running_allocation_counts_until_now(world):
    bound(world, started=at("2026-11-30 09:45"))
    [row] = report("project", now="2026-11-30 12:00")
    assert numbers(row) == (Decimal("4.5000"), Decimal("18.00"))  # 2.25 h x 2 cards
    [later] = report("project", now="2026-11-30 12:30")
    assert later["card_hours"] == Decimal("5.5000")


def test_allocations_outside_the_months_asked_for_are_left_out(world):
    bound(world, started=at("2026-09-01 00:00"), released=at("2026-09-30 00:00"))
    bound(world, spec=world.half, started=at("2026-11-10 00:00"), released=at("2026-11-10 01:00"))
    assert [numbers(row) for row in report("project")] == [(Decimal("0.5000"), Decimal("0.50"))]


def test_grouped_by_tenant_accelerator_model_spec_and_request(world):
    first = bound(world, started=at("2026-11-01 00:00"), released=at("2026-11-01 01:00"))
    second = bound(
        world,
        spec=world.half,
        project=world.other_project,
        started=at("2026-11-01 00:00"),
        released=at("2026-11-01 02:00"),
    )
    rows = report("tenant", "accelerator_model", "spec", "request")
    assert [
        (row["tenant"], row["accelerator_model"], row["spec"], row["request"], row["card_hours"]) for row in rows
    ] == sorted(
        [
            (world.project.tenant.slug, world.model.slug, world.whole.slug, first.request_id, Decimal(2)),
            (world.other_project.tenant.slug, world.model.slug, world.half.slug, second.request_id, Decimal(1)),
        ],
        key=lambda row: tuple(str(part) for part in row[:4]),
    )


def test_developers_see_only_their_projects(world):
    bound(world, started=at("2026-11-01 00:00"), released=at("2026-11-01 01:00"))
    bound(world, project=world.other_project, started=at("2026-11-01 00:00"), released=at("2026-11-01 01:00"))
    assert [row["project"] for row in report("project", user=world.developer)] == [world.project.slug]
    assert report("project", user=factories.UserFactory()) == []
