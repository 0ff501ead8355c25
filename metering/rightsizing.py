"""Rightsizing: would a smaller standard spec, or a slice, have served what a project actually used? Pure: no Django.

Evidence per project and spec comes from the daily rollups over a window: how many requests ran, their mean
utilization per card, and the busiest day's 95th percentiles of busy cards and memory in use (the highest daily
p95, so one heavy day is enough to keep a recommendation away). A spec is recommended when use was consistently
low (mean utilization at most the policy's threshold over enough requests) and it shares an accelerator model with
the requested spec, is smaller, has at least the p95 busy cards (busier is slower, not broken) and the p95 memory
plus the policy's headroom (running out of memory fails the job). The card-hours idle detection saw idle
(metering.idle) go along as evidence and into the message.
"""

from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class SpecShape:
    slug: str
    label: str  # short: "8x H100 80GB SXM" or, for a slice, "3g.40gb"
    cards: Decimal  # whole-card equivalents
    memory_gb: int
    is_slice: bool
    models: frozenset[str]
    hourly_cost: Decimal


@dataclass(frozen=True)
class Evidence:
    project: str
    spec: str
    requests: int
    mean_utilization_pct: float
    p95_busy_cards: float
    p95_memory_gb: float
    mean_memory_gb: float
    idle_card_hours: float = 0.0  # of the window's requests, the card-hours idle detection saw idle (metering.idle)


@dataclass(frozen=True)
class Policy:
    window_days: int
    min_requests: int
    max_mean_utilization_pct: float
    headroom_pct: float


@dataclass(frozen=True)
class Recommendation:
    evidence: Evidence
    requested: SpecShape
    suggestions: tuple[SpecShape, ...]  # the smallest whole-card spec first, then the smallest slice
    message: str

    @property
    def p95_utilization_pct(self) -> float:
        return 100 * self.evidence.p95_busy_cards / float(self.requested.cards)

    def as_data(self) -> dict:
        evidence = self.evidence
        return {
            "project": evidence.project,
            "spec": self.requested.slug,
            "requested": self.requested.label,
            "requests": evidence.requests,
            "mean_utilization_pct": round(evidence.mean_utilization_pct, 1),
            "p95_utilization_pct": round(self.p95_utilization_pct, 1),
            "p95_busy_cards": round(evidence.p95_busy_cards, 2),
            "p95_memory_gb": round(evidence.p95_memory_gb, 1),
            "mean_memory_gb": round(evidence.mean_memory_gb, 1),
            "idle_card_hours": round(evidence.idle_card_hours, 1),
            "suggestions": [
                {
                    "spec": shape.slug,
                    "label": shape.label,
                    "cards": str(shape.cards),
                    "memory_gb": shape.memory_gb,
                    "slice": shape.is_slice,
                    "hourly_saving": str(self.requested.hourly_cost - shape.hourly_cost),
                }
                for shape in self.suggestions
            ],
            "message": self.message,
        }


def _holds(shape: SpecShape, evidence: Evidence, headroom: float) -> bool:
    return float(shape.cards) >= evidence.p95_busy_cards and shape.memory_gb >= evidence.p95_memory_gb * headroom


def _smallest(shapes: list[SpecShape]) -> SpecShape | None:
    return min(shapes, key=lambda shape: (shape.cards, shape.hourly_cost, shape.slug), default=None)


def recommend(
    evidence: Evidence, requested: SpecShape, catalog: list[SpecShape], policy: Policy
) -> Recommendation | None:
    if evidence.requests < policy.min_requests or evidence.mean_utilization_pct > policy.max_mean_utilization_pct:
        return None
    headroom = 1 + policy.headroom_pct / 100
    fitting = [
        shape
        for shape in catalog
        if shape.models & requested.models and shape.cards < requested.cards and _holds(shape, evidence, headroom)
    ]
    suggestions = tuple(
        shape
        for shape in (_smallest([s for s in fitting if not s.is_slice]), _smallest([s for s in fitting if s.is_slice]))
        if shape is not None
    )
    if not suggestions:
        return None
    message = (
        f"{requested.label} requested {evidence.requests} times in {policy.window_days} days, mean "
        f"utilization {evidence.mean_utilization_pct:.0f}%, p95 memory {evidence.p95_memory_gb:.0f} GiB: "
        f"{' or '.join(shape.label for shape in suggestions)} would have served."
    )
    if evidence.idle_card_hours >= 1:
        message += f" {evidence.idle_card_hours:.0f} card-hours sat idle until stopped or used again."
    return Recommendation(evidence, requested, suggestions, message)
