"""Scheduler gauges for /metrics: the queue by reason, allocations, and device capacity by model and state."""

from django.db.models import Count, Q, Sum
from prometheus_client.core import GaugeMetricFamily

from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device


class SchedulerCollector:
    """Reads the database on every scrape (three grouped queries)."""

    def collect(self):
        queued = GaugeMetricFamily(
            "catalog_queue_requests", "Queued requests by their current wait reason.", labels=["reason"]
        )
        for row in (
            ResourceRequest.objects.filter(state=RequestState.QUEUED)
            .values("queue_reason__code")
            .annotate(n=Count("id"))
            .order_by()
        ):
            queued.add_metric([row["queue_reason__code"] or "not_yet_scheduled"], row["n"])
        yield queued
        allocations = GaugeMetricFamily("catalog_allocations_active", "Active allocations.")
        allocations.add_metric([], Allocation.objects.filter(state=AllocationState.ACTIVE).count())
        yield allocations
        devices = GaugeMetricFamily(
            "catalog_devices", "Accelerator devices by model and state.", labels=["model", "state"]
        )
        allocated = GaugeMetricFamily(
            "catalog_devices_allocated_cards",
            "Whole-card equivalents bound to active allocations, by model.",
            labels=["model"],
        )
        for row in (
            Device.objects.values("model__slug")
            .annotate(
                total=Count("id"),
                n_isolated=Count("id", filter=Q(isolated=True)),
                n_degraded=Count("id", filter=Q(isolated=False, health="degraded")),
                milli=Sum("allocated_milli"),
            )
            .order_by("model__slug")
        ):
            model = row["model__slug"]
            devices.add_metric([model, "total"], row["total"])
            devices.add_metric([model, "isolated"], row["n_isolated"])
            devices.add_metric([model, "degraded"], row["n_degraded"])
            allocated.add_metric([model], (row["milli"] or 0) / 1000)
        yield devices
        yield allocated
