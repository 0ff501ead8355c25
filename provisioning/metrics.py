"""Prometheus metrics read at scrape time: runs by state, step durations and attempts."""

from django.db.models import Count, DurationField, ExpressionWrapper, F, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from provisioning.choices import StepState
from provisioning.models import ProvisioningRun, ProvisioningStep


class ProvisioningCollector:
    def collect(self):
        runs = GaugeMetricFamily(
            "compute_provisioning_runs",
            "Provisioning runs by kind, pipeline and state.",
            labels=["kind", "pipeline", "state"],
        )
        for row in ProvisioningRun.objects.values("kind", "pipeline", "state").annotate(n=Count("id")).order_by():
            runs.add_metric([row["kind"], row["pipeline"], row["state"]], row["n"])
        yield runs
        seconds = CounterMetricFamily(
            "compute_provisioning_step_seconds",
            "Time spent in finished provisioning steps, by step and outcome.",
            labels=["step", "state"],
        )
        count = CounterMetricFamily(
            "compute_provisioning_steps", "Finished provisioning steps, by step and outcome.", labels=["step", "state"]
        )
        attempts = CounterMetricFamily(
            "compute_provisioning_step_attempts",
            "Attempts made by finished provisioning steps.",
            labels=["step", "state"],
        )
        finished = (
            ProvisioningStep.objects.filter(
                state__in=[StepState.SUCCEEDED, StepState.FAILED], started_at__isnull=False, attempts__gt=0
            )
            .values("name", "state")
            .order_by()
            .annotate(
                n=Count("id"),
                tries=Sum("attempts"),
                total=Sum(ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())),
            )
        )
        for row in finished:
            labels = [row["name"], row["state"]]
            seconds.add_metric(labels, row["total"].total_seconds() if row["total"] else 0.0)
            count.add_metric(labels, row["n"])
            attempts.add_metric(labels, row["tries"])
        yield from (seconds, count, attempts)
