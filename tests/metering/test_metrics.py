"""/metrics with metering's families, parsed back with prometheus_client's own parser."""

from datetime import date
from decimal import Decimal

import pytest
from django.conf import settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from metering import services
from scheduling import cycle
from scheduling.services import device_isolate
from tenancy.models import MonthlyUsage
from tests.metering.conftest import at, bound

pytestmark = pytest.mark.django_db


def scrape(client) -> tuple[dict, dict]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_TOKEN}")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=")
    families = list(text_string_to_metric_families(response.content.decode()))
    names = [family.name for family in families]
    assert len(names) == len(set(names)), "a metric family is exported twice"
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }
    return {family.name: family.type for family in families}, samples


def test_requests_capacity_card_hours_and_budget(client, world):
    bound(world, started=at("2026-11-30 09:00"))  # running: 2 cards of 4
    device_isolate(device=world.node.devices.get(index=3), reason="XID 79")
    MonthlyUsage.objects.create(project=world.project, month=date(2026, 10, 1), card_hours=Decimal("30.5"))
    MonthlyUsage.objects.create(
        project=world.project, month=timezone.now().date().replace(day=1), card_hours=Decimal(40)
    )
    types, samples = scrape(client)
    assert samples[("catalog_requests", (("state", "active"),))] == 1
    assert samples[("catalog_requests", (("state", "queued"),))] == 0
    model = world.model.slug
    assert samples[("catalog_devices_free_cards", (("health", "healthy"), ("model", model)))] == 1
    assert samples[("catalog_devices_free_cards", (("health", "isolated"), ("model", model)))] == 1
    project, tenant = world.project.slug, world.project.tenant.slug
    assert types["catalog_card_hours"] == "counter"
    assert samples[("catalog_card_hours_total", (("project", project), ("tenant", tenant)))] == 70.5
    assert samples[("catalog_budget_used_ratio", (("project", project),))] == 0.4
    assert types["catalog_devices"] == types["catalog_allocations_active"] == "gauge"  # scheduling's, once


def test_scheduler_cycle_durations_are_a_histogram(client, world):
    types, samples = scrape(client)
    assert samples[("catalog_scheduler_cycle_seconds_count", ())] == 0
    cycle.run_cycle()
    cycle.run_cycle()
    types, samples = scrape(client)
    assert types["catalog_scheduler_cycle_seconds"] == "histogram"
    assert samples[("catalog_scheduler_cycle_seconds_count", ())] == 2
    assert samples[("catalog_scheduler_cycle_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("catalog_scheduler_cycle_seconds_bucket", (("le", "60.0"),))] == 2
    assert 0 < samples[("catalog_scheduler_cycle_seconds_sum", ())] < 60


def test_observations_land_in_every_cumulative_bucket_they_fit(client, db):
    for seconds in (0.07, 0.3, 4.0, 120.0):
        services.duration_observe(metric="catalog_scheduler_cycle_seconds", seconds=seconds, bounds=(0.1, 1.0, 5.0))
    _, samples = scrape(client)
    buckets = {
        dict(labels)["le"]: value
        for (name, labels), value in samples.items()
        if name == "catalog_scheduler_cycle_seconds_bucket"
    }
    assert buckets == {"0.1": 1, "1.0": 2, "5.0": 3, "+Inf": 4}
    assert samples[("catalog_scheduler_cycle_seconds_sum", ())] == pytest.approx(124.37)


def test_metrics_need_no_session_but_honour_the_token(client, db, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
