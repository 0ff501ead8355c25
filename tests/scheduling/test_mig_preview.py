"""The order preview of a MIG slice gives the answer the cycle would give: placed geometry-true on the layouts as
they are now, behind the queue, with its reasons in MIG terms (not the milli-share model's "fits")."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests.choices import RequestState
from scheduling import cycle
from scheduling.models import MigInstance
from tests.scheduling import test_mig_cycle
from tests.scheduling.test_cycle import queued
from tests.scheduling.test_mig_cycle import h100_node, held_1g_at_0_and_4
from tests.scheduling.test_preview_outcome import PREVIEW, order_body

pytestmark = pytest.mark.django_db
shop, team = test_mig_cycle.shop, test_mig_cycle.team


def preview(api_as, shop, team, profile: str) -> dict:
    body = order_body(shop, team, spec=shop.specs[profile])
    response = api_as(team.developer).post(PREVIEW, body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["placement"]


@pytest.mark.parametrize("cycle_first", [False, True])
def test_a_slice_with_no_valid_placement_does_not_fit_now_and_says_why_in_mig_terms(shop, team, api_as, cycle_first):
    held_1g_at_0_and_4(shop)
    if cycle_first:  # with a cycle outcome (milli-shares per card) as with none: the layouts decide
        cycle.run_cycle()
    answer = preview(api_as, shop, team, "3g.40gb")
    assert (answer["fits_now"], answer["never_fits"], answer["code"]) == (False, False, "fragmentation")
    assert answer["message"] == (
        "Would wait: needs 3g.40gb; gpu 0 on node n7 has free memory slices 1–3 and 5–7, "  # noqa: RUF001
        "no valid 3g placement (starts 0 or 4)."
    )
    assert answer["details"]["free_memory_slices"] == [1, 2, 3, 5, 6, 7]
    # and the cycle says the same of the same order
    waiting = queued(shop, team, spec=shop.specs["3g.40gb"])
    cycle.run_cycle()
    waiting.refresh_from_db()
    assert waiting.state == RequestState.QUEUED
    assert (waiting.queue_reason["code"], waiting.queue_reason["numbers"]["free_memory_slices"]) == (
        "fragmentation",
        [1, 2, 3, 5, 6, 7],
    )


def test_a_slice_that_fits_now_is_placed_where_the_cycle_places_it(shop, team, api_as):
    held_1g_at_0_and_4(shop)
    h100_node(shop, name="n8")  # an empty card: 3g.40gb fits there
    answer = preview(api_as, shop, team, "3g.40gb")
    assert (answer["fits_now"], answer["node"], answer["queued_ahead"]) == (True, "n8", 0)
    request = queued(shop, team, spec=shop.specs["3g.40gb"])
    cycle.run_cycle()
    assert MigInstance.objects.get(allocation__request=request).device.node.name == "n8"


def test_the_queue_ahead_is_placed_first_and_a_second_4g_has_no_room(shop, team, api_as):
    """An H100 has one 4g.40gb placement (start 0): the queued one takes it, the order would wait for it."""
    h100_node(shop)
    assert preview(api_as, shop, team, "4g.40gb")["fits_now"] is True
    queued(shop, team, spec=shop.specs["4g.40gb"])
    answer = preview(api_as, shop, team, "4g.40gb")
    assert (answer["fits_now"], answer["code"], answer["queued_ahead"]) == (False, "capacity_in_use", 1)
    assert "needs 4g.40gb" in answer["message"]
    # a 3g.40gb still fits beside it (start 4), as the cycle would put it
    assert preview(api_as, shop, team, "3g.40gb")["fits_now"] is True


def test_the_mig_preview_costs_the_same_queries_behind_a_longer_queue(shop, team, api_as):
    h100_node(shop)

    def preview_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            preview(api_as, shop, team, "3g.40gb")
        return len(queries)

    queued(shop, team, spec=shop.specs["4g.40gb"])
    queued(shop, team, spec=shop.specs["3g.40gb"])  # the card is full: the order would wait
    preview_queries()  # what a process reads once (permissions, content types) is not the preview's
    two_ahead = preview_queries()
    for _ in range(5):
        queued(shop, team, spec=shop.specs["3g.40gb"])
    assert preview_queries() == two_ahead
