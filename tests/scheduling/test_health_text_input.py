"""Exposition text that is not a sample line at all is a 400 validation_error, never a 500 (found by the fuzz)."""

import pytest

from scheduling.models import HealthEvent
from tests.scheduling.health_inventory import ingest_user

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("text", ["{}", "{} 1", '{gpu="0"} 95', "=\n"])
def test_text_without_a_metric_name_is_a_400(api_as, text):
    response = api_as(ingest_user()).post("/api/v1/health/events/", text, content_type="text/plain; version=0.0.4")

    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] == "validation_error"
    assert not HealthEvent.objects.exists()
