"""Geometry of the usage page's charts, drawn as inline SVG by templates/metering/_chart.html (no JavaScript, no
CDN). Pure: no Django. Each chart is a dict the template reads: size, axis ticks, bars and/or polylines."""

import math

WIDTH, HEIGHT = 560, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 8, 12, 30  # margins around the plot area
TICKS = 4


def _nice_top(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^n at or above `value` (the axis maximum)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    return next(step * magnitude for step in (1, 2, 2.5, 5, 10) if step * magnitude >= value)


def _label(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:,.2f}".rstrip("0").rstrip(".")


class _Axis:
    def __init__(self, low: float, high: float):
        self.low, self.high = low, high
        self.bottom, self.span = HEIGHT - BOTTOM, HEIGHT - BOTTOM - TOP

    def y(self, value: float) -> float:
        return round(self.bottom - (value - self.low) / (self.high - self.low) * self.span, 1)

    def ticks(self) -> list[dict]:
        step = (self.high - self.low) / TICKS
        return [{"y": self.y(self.low + i * step), "label": _label(self.low + i * step)} for i in range(TICKS + 1)]


def _frame(title: str, unit: str, axis: _Axis) -> dict:
    return {
        "title": title,
        "unit": unit,
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "top": TOP,
        "baseline": axis.y(max(axis.low, 0)),
        "ticks": axis.ticks(),
        "bars": [],
        "lines": [],
        "labels": [],
    }


def _x_labels(names: list[str], x_of, every: int) -> list[dict]:
    """Every `every`th label and the last one, leaving out a regular one that would crowd the last."""
    last = len(names) - 1
    return [
        {"x": x_of(i), "text": name}
        for i, name in enumerate(names)
        if i == last or (i % every == 0 and last - i >= every / 2)
    ]


def bar_chart(title: str, unit: str, points: list[tuple[str, float]]) -> dict:
    """One bar per (label, value); values are never negative."""
    axis = _Axis(0, _nice_top(max((value for _, value in points), default=0)))
    chart = _frame(title, unit, axis)
    slot = (WIDTH - LEFT - RIGHT) / max(len(points), 1)
    for i, (name, value) in enumerate(points):
        top = axis.y(value)
        chart["bars"].append(
            {
                "x": round(LEFT + i * slot + slot * 0.15, 1),
                "y": top,
                "width": round(slot * 0.7, 1),
                "height": round(axis.bottom - top, 1),
                "name": name,
                "value": _label(value),
            }
        )
    chart["labels"] = _x_labels(
        [name for name, _ in points],
        lambda i: round(LEFT + (i + 0.5) * slot, 1),
        every=max(1, math.ceil(len(points) / 12)),
    )
    return chart


def burn_down_chart(title: str, unit: str, days: list[str], remaining: list[float], budget: float) -> dict:
    """What is left of a monthly budget day by day (`remaining` covers the days so far of the month's `days`),
    against the even burn from the full budget on the first day to nothing on the last."""
    axis = _Axis(min(0.0, *remaining) if remaining else 0.0, _nice_top(budget))
    chart = _frame(title, unit, axis)
    step = (WIDTH - LEFT - RIGHT) / max(len(days) - 1, 1)

    def x(i: int) -> float:
        return round(LEFT + i * step, 1)

    chart["lines"] = [
        {"kind": "even", "points": f"{x(0)},{axis.y(budget)} {x(len(days) - 1)},{axis.y(0)}"},
        {"kind": "actual", "points": " ".join(f"{x(i)},{axis.y(value)}" for i, value in enumerate(remaining))},
    ]
    chart["labels"] = _x_labels([day[-2:] for day in days], x, every=7)
    return chart
