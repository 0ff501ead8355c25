"""/metrics speaks the real Prometheus text format, parsed back with prometheus_client's own parser."""

import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from requests.models import ResourceRequest
from scheduling import cycle
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def _samples(response) -> dict:
    assert response["Content-Type"].startswith("text/plain; version=")  # the exposition format
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_queue_gauges_per_reason_and_device_capacity(client, shop, team):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    running, waiting = queued(shop, team), queued(shop, team)
    cycle.run_cycle()
    assert ResourceRequest.objects.get(pk=waiting.pk).queue_reason["code"] == "capacity_in_use"
    samples = _samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_TOKEN}"))
    assert samples[("catalog_queue_requests", (("reason", "capacity_in_use"),))] == 1
    assert samples[("catalog_allocations_active", ())] == 1
    model = shop.accelerator.slug
    assert samples[("catalog_devices", (("model", model), ("state", "total")))] == 2
    assert samples[("catalog_devices_allocated_cards", (("model", model),))] == 2
    assert ResourceRequest.objects.get(pk=running.pk).state == "allocated"


def test_metrics_token_is_required_when_configured(client, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
