"""Reasons people read name accelerator models as the catalog does ("8 x H100 Test 80GB", with the engine's
multiplication sign), never by slug: the queue reason a cycle stores, the preview's "never fits", and the catalog's
"cannot run here"; the numbers keep identifiers."""

import pytest

from scheduling import cycle
from scheduling.reason_words import named
from tests import factories
from tests.scheduling.test_cycle import (  # noqa: F401 (fixtures)
    NEVER_FITS,
    add_node,
    eight_cards,
    never_fitting_order,
    queued,
    shop,
    team,
)

pytestmark = pytest.mark.django_db
TIMES = "\N{MULTIPLICATION SIGN}"  # how the engine writes "8 cards of"


@pytest.fixture
def named_model(shop):  # noqa: F811
    shop.accelerator.slug, shop.accelerator.name = "h100-test-80gb", "H100 Test 80GB"
    shop.accelerator.save()
    return shop.accelerator


def test_slugs_become_names_and_counts_stand_apart(named_model):
    other = factories.AcceleratorModelFactory(slug="l40s-48gb", name="L40S 48GB")

    message = named(f"needs 8{TIMES}h100-test-80gb; the largest h100-test-80gb/l40s-48gb node has 4 (h100-test-80gb-7)")

    assert (
        message == f"needs 8{TIMES} H100 Test 80GB; the largest H100 Test 80GB/L40S 48GB node has 4 (h100-test-80gb-7)"
    )
    slugged = f"needs 8{TIMES}h100-test-80gb"
    assert named(slugged, [other]) == slugged and named(slugged, []) == slugged  # only the models given


def test_a_stored_queue_reason_names_the_model(shop, team, eight_cards, named_model, api_as):  # noqa: F811
    waiting = queued(shop, team, spec=eight_cards)
    cycle.run_cycle()

    queue = api_as(team.developer).get(f"/api/v1/requests/{waiting.pk}/").json()["queue"]

    assert queue["numbers"] == NEVER_FITS
    assert f"needs 8{TIMES} H100 Test 80GB with 128 cores" in queue["message"]
    assert "the largest H100 Test 80GB node has 112" in queue["message"] and "h100-test-80gb" not in queue["message"]


def test_the_preview_and_the_catalog_say_never_fits_with_the_model_s_name(
    client,
    shop,  # noqa: F811
    team,  # noqa: F811
    eight_cards,  # noqa: F811
    named_model,
    api_as,
):
    body = never_fitting_order(shop, team, eight_cards)
    preview = api_as(team.developer).post("/api/v1/requests/preview/", body, format="json").json()["placement"]
    assert preview["message"].startswith(f"Needs 8{TIMES} H100 Test 80GB with 128 cores")
    assert preview["details"] == NEVER_FITS

    client.force_login(team.developer)
    catalog = client.get("/").content.decode()
    assert "cannot run here" in catalog and f"8{TIMES} H100 Test 80GB" in catalog and "h100-test-80gb" not in catalog
