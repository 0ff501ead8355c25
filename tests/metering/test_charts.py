"""Chart geometry (pure): axes end on round numbers, bars stand on the baseline, the burn-down's two lines."""

import pytest

from metering.charts import HEIGHT, bar_chart, burn_down_chart


def test_bars_scale_to_a_round_top_and_stand_on_the_baseline():
    chart = bar_chart("Card-hours per month", "card-hours", [("2026-10", 120.0), ("2026-11", 0.0), ("2026-12", 37.5)])
    assert [tick["label"] for tick in chart["ticks"]] == ["0", "50", "100", "150", "200"]
    tall, empty, short = chart["bars"]
    assert tall["y"] + tall["height"] == empty["y"] + empty["height"] == chart["baseline"]
    assert empty["height"] == 0 and tall["height"] == pytest.approx(3.2 * short["height"], abs=0.2)  # rounded to 0.1
    assert [label["text"] for label in chart["labels"]] == ["2026-10", "2026-11", "2026-12"]


def test_nothing_to_show_still_draws_an_axis():
    chart = bar_chart("Energy per month", "kWh", [("2026-11", 0.0)])
    assert chart["ticks"][-1]["label"] == "1" and chart["bars"][0]["height"] == 0


def test_burn_down_draws_the_even_burn_and_what_is_left_day_by_day():
    days = [f"2026-11-{day:02d}" for day in range(1, 31)]
    chart = burn_down_chart("Budget", "card-hours", days, [100.0, 90.0, 60.0, -20.0], budget=100.0)
    even, actual = chart["lines"]
    assert (even["kind"], actual["kind"]) == ("even", "actual")
    assert len(actual["points"].split()) == 4
    assert chart["ticks"][0]["label"] == "-20" and chart["ticks"][0]["y"] == HEIGHT - 30  # below zero: overspent
    assert [label["text"] for label in chart["labels"]] == ["01", "08", "15", "22", "30"]
