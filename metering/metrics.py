"""Metering's part of /metrics: requests by state, free capacity by model and health, card-hours per project (a
counter), this month's budget use, and the scheduler's cycle durations (a histogram kept in the database).

Scheduling exports the queue by reason, active allocations and devices by state itself (scheduling/metrics.py);
provisioning and model serving register their own collectors. Five grouped queries per scrape.
"""

from collections import defaultdict

from django.db.models import Count, F, Sum, Value
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from metering.models import HistogramBucket, TokenUsage
from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling.engine import MILLI
from scheduling.models import Device
from tenancy.models import MonthlyUsage

SCHEDULER_CYCLE_SECONDS = "catalog_scheduler_cycle_seconds"
SCHEDULER_CYCLE_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def requests_by_state() -> GaugeMetricFamily:
    family = GaugeMetricFamily("catalog_requests", "Resource requests by state.", labels=["state"])
    counts = dict(ResourceRequest.objects.values_list("state").annotate(n=Count("id")).order_by())
    for state in RequestState.values:
        family.add_metric([state], counts.get(state, 0))
    return family


def free_capacity() -> GaugeMetricFamily:
    """Unbound whole-card equivalents by model and health; isolated cards count under health="isolated"."""
    family = GaugeMetricFamily(
        "catalog_devices_free_cards",
        "Whole-card equivalents not bound to any allocation, by model and health.",
        labels=["model", "health"],
    )
    free = defaultdict(int)
    for model, health, isolated, milli in (
        Device.objects.values_list("model__slug", "health", "isolated")
        .annotate(milli=Sum(Value(MILLI) - F("allocated_milli")))
        .order_by()
    ):
        free[(model, "isolated" if isolated else health)] += milli
    for (model, health), milli in sorted(free.items()):
        family.add_metric([model, health], milli / MILLI)
    return family


def card_hours_by_project() -> CounterMetricFamily:
    """From the quota ledger (refreshed every few minutes), which only grows: a counter."""
    family = CounterMetricFamily(
        "catalog_card_hours", "Accelerator card-hours metered, by project and tenant.", labels=["project", "tenant"]
    )
    for project, tenant, hours in (
        MonthlyUsage.objects.values_list("project__slug", "project__tenant__slug")
        .annotate(hours=Sum("card_hours"))
        .order_by("project__slug")
    ):
        family.add_metric([project, tenant], float(hours))
    return family


def budget_use() -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "catalog_budget_used_ratio",
        "Share of this month's card-hour budget used, by project (1 = used up).",
        labels=["project"],
    )
    for project, used, limit in (
        MonthlyUsage.objects.filter(
            month=timezone.now().date().replace(day=1), project__quota__monthly_card_hours__gt=0
        )
        .values_list("project__slug", "card_hours", "project__quota__monthly_card_hours")
        .order_by("project__slug")
    ):
        family.add_metric([project], float(used / limit))
    return family


def scheduler_cycle_durations() -> HistogramMetricFamily:
    buckets = list(HistogramBucket.objects.filter(metric=SCHEDULER_CYCLE_SECONDS).order_by("le"))
    return HistogramMetricFamily(
        SCHEDULER_CYCLE_SECONDS,
        "Duration of scheduling cycles that ran (held the cycle lock).",
        buckets=[(floatToGoString(bucket.le), bucket.count) for bucket in buckets] or [("+Inf", 0)],
        sum_value=buckets[-1].sum_seconds if buckets else 0,
    )


def tokens_by_project_and_model() -> list[CounterMetricFamily]:
    families = {
        kind: CounterMetricFamily(
            f"compute_serving_{kind}_tokens",
            f"{kind.capitalize()} tokens served by the gateway.",
            labels=["project", "model"],
        )
        for kind in ("prompt", "completion")
    }
    totals = (
        TokenUsage.objects.values("model", project_slug=F("project__slug"))
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
        .order_by()
    )
    for row in totals:
        for kind, family in families.items():
            family.add_metric([row["project_slug"], row["model"]], row[kind])
    return list(families.values())


class MeteringCollector:
    def collect(self):
        yield from tokens_by_project_and_model()
        yield requests_by_state()
        yield free_capacity()
        yield card_hours_by_project()
        yield budget_use()
        yield scheduler_cycle_durations()
