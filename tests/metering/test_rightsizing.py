"""Rightsizing on crafted usage: the pure rule, then advice from daily rollups for the projects one may see."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from metering import rightsizing
from metering.models import IdleWatch
from metering.selectors import recommendations
from tests import factories
from tests.metering.conftest import rolled_up

H100 = frozenset({"h100"})
POLICY = rightsizing.Policy(window_days=30, min_requests=3, max_mean_utilization_pct=40, headroom_pct=20)


def shape(slug, cards, memory_gb, *, slice_=False, models=H100, price="3.90"):
    label = slug if slice_ else f"{cards}x H100"
    return rightsizing.SpecShape(
        slug, label, Decimal(str(cards)), memory_gb, slice_, models, Decimal(price) * Decimal(str(cards))
    )


EIGHT = shape("h100-8x", 8, 640)
CATALOG = [
    EIGHT,
    shape("h100-1x", 1, 80),
    shape("h100-2x", 2, 160),
    shape("3g.40gb", "0.4286", 40, slice_=True),
    shape("1g.10gb", "0.1429", 10, slice_=True),
    shape("a100-1x", 1, 40, models=frozenset({"a100"})),
]


def evidence(*, requests=12, mean=4.0, busy=0.4, memory=22.0) -> rightsizing.Evidence:
    return rightsizing.Evidence("vision", "h100-8x", requests, mean, busy, memory, memory / 2)


def test_consistently_low_use_gets_the_smallest_whole_card_spec_and_slice_that_would_have_served():
    advice = rightsizing.recommend(evidence(), EIGHT, CATALOG, POLICY)
    assert [suggestion.slug for suggestion in advice.suggestions] == ["h100-1x", "3g.40gb"]
    assert advice.message == (
        "8x H100 requested 12 times in 30 days, mean utilization 4%, p95 memory 22 GiB: "
        "1x H100 or 3g.40gb would have served."
    )
    assert advice.p95_utilization_pct == 5.0  # 0.4 of 8 cards


def test_memory_needs_headroom_and_compute_must_fit_at_the_95th_percentile():
    tight_memory = rightsizing.recommend(evidence(memory=34.0), EIGHT, CATALOG, POLICY)  # 40.8 GB with headroom
    assert [suggestion.slug for suggestion in tight_memory.suggestions] == ["h100-1x"]
    busier = rightsizing.recommend(evidence(mean=14.0, busy=1.1), EIGHT, CATALOG, POLICY)
    assert [suggestion.slug for suggestion in busier.suggestions] == ["h100-2x"]


@pytest.mark.parametrize(
    "kwargs",
    [{"requests": 2}, {"mean": 41.0}, {"busy": 7.5}],
    ids=["too few requests", "busy on average", "nothing smaller holds the peak"],
)
def test_no_advice_without_consistent_evidence(kwargs):
    assert rightsizing.recommend(evidence(**kwargs), EIGHT, CATALOG, POLICY) is None


def test_advice_data_carries_the_evidence():
    data = rightsizing.recommend(evidence(), EIGHT, CATALOG, POLICY).as_data()
    assert {
        key: data[key] for key in ("spec", "requests", "mean_utilization_pct", "p95_utilization_pct", "p95_memory_gb")
    } == {
        "spec": "h100-8x",
        "requests": 12,
        "mean_utilization_pct": 4.0,
        "p95_utilization_pct": 5.0,
        "p95_memory_gb": 22.0,
    }
    assert data["suggestions"][0] == {
        "spec": "h100-1x",
        "label": "1x H100",
        "cards": "1",
        "memory_gb": 80,
        "slice": False,
        "hourly_saving": "27.30",
    }


# --- from the rollups ---------------------------------------------------------------------------------------

TODAY = date(2026, 11, 30)


def used(world, spec, *, days_ago: int, busy: float, memory_gb: float, mean_pct: float):
    return rolled_up(
        world, spec, day=TODAY - timedelta(days=days_ago), busy=busy, memory_gb=memory_gb, mean_pct=mean_pct
    )


@pytest.mark.django_db
def test_recommendations_from_daily_rollups(world, eight_cards):
    for days_ago in (2, 5, 9):
        used(world, eight_cards.eight, days_ago=days_ago, busy=0.38, memory_gb=20 + days_ago / 3, mean_pct=4.5)
    used(world, eight_cards.eight, days_ago=45, busy=7.9, memory_gb=600, mean_pct=99)  # outside the window
    [advice] = recommendations(user=factories.operator(), today=TODAY)
    assert [suggestion.slug for suggestion in advice.suggestions] == [eight_cards.one.slug, eight_cards.mig.slug]
    assert advice.message == (
        "8x Test H100 80GB requested 3 times in 30 days, mean utilization 4%, p95 memory 23 GiB: "
        "1x Test H100 80GB or 3g.40gb would have served."
    )
    assert advice.evidence.mean_memory_gb == pytest.approx((20 + 2 / 3 + 20 + 5 / 3 + 20 + 3) / 3 / 2)


@pytest.mark.django_db
def test_one_busy_day_keeps_the_advice_away_and_developers_see_only_their_projects(world, eight_cards):
    for days_ago in (2, 5, 9):
        used(world, eight_cards.eight, days_ago=days_ago, busy=0.38, memory_gb=20, mean_pct=4.5)
    assert recommendations(user=world.developer, today=TODAY)
    assert recommendations(user=factories.member(world.other_project), today=TODAY) == []
    used(world, eight_cards.eight, days_ago=3, busy=6.5, memory_gb=20, mean_pct=4.5)
    assert recommendations(user=world.developer, today=TODAY) == []


@pytest.mark.django_db
def test_a_multi_node_spec_is_compared_as_the_whole_gang():
    from metering.selectors import _spec_shapes

    model = factories.AcceleratorModelFactory(name="H100 80GB", memory_gb=80)
    spec = factories.ResourceSpecFactory(
        accelerator_models=[model], accelerator_count=8, node_count=2, topology_level="rack", hourly_price=Decimal(1)
    )
    shape = _spec_shapes()[spec.pk]
    assert shape.label == "2 nodes x 8x H100 80GB"
    assert (shape.cards, shape.memory_gb, shape.hourly_cost) == (Decimal(16), 1280, Decimal(16))


def test_idle_card_hours_go_along_as_evidence_and_into_the_message():
    idle = rightsizing.Evidence("vision", "h100-8x", 12, 4.0, 0.4, 22.0, 11.0, idle_card_hours=96.4)
    advice = rightsizing.recommend(idle, EIGHT, CATALOG, POLICY)
    assert advice.message.endswith("would have served. 96 card-hours sat idle until stopped or used again.")
    assert advice.as_data()["idle_card_hours"] == 96.4
    assert rightsizing.recommend(evidence(), EIGHT, CATALOG, POLICY).as_data()["idle_card_hours"] == 0.0


@pytest.mark.django_db
def test_recommendations_count_the_idle_card_hours_idle_detection_saw(world, eight_cards):
    for days_ago in (2, 5, 9):
        usage = used(world, eight_cards.eight, days_ago=days_ago, busy=0.38, memory_gb=21, mean_pct=4.5)
        IdleWatch.objects.create(request=usage.allocation.request, idle_card_seconds=8 * 3600 * 2)
    IdleWatch.objects.filter(pk=IdleWatch.objects.order_by("pk").first().pk).update(
        updated_at=datetime(2026, 9, 1, tzinfo=UTC)  # outside the window
    )
    with time_machine.travel(datetime(2026, 11, 30, 12, tzinfo=UTC), tick=False):
        [advice] = recommendations(user=factories.operator(), today=TODAY)
    assert advice.evidence.idle_card_hours == 32.0
    assert advice.message.endswith(" 32 card-hours sat idle until stopped or used again.")
