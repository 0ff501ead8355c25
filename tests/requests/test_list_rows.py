"""The request list and queue pages build their rows from value rows (RequestRowsSerializer), not through DRF's
fields: each row must say byte for byte what RequestSummarySerializer says of the same request."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection
from rest_framework.renderers import JSONRenderer

from catalog.choices import ServiceKind
from requests.api.serializers import RequestSummarySerializer
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.selectors import queue_visible_to
from tests import factories
from tests.requests.conftest import make_order
from tests.requests.lifecycle import stored_request

pytestmark = pytest.mark.django_db

SEEN = datetime(2026, 12, 2, 16, 30, 5, 123456, tzinfo=UTC)


def stored(shop, team, state, **fields) -> ResourceRequest:
    """A request in `state`, then with `fields` written as they are (what a list must render, not how it got so)."""
    request = stored_request(make_order(shop, team.project), team.developer, state)
    ResourceRequest.objects.filter(pk=request.pk).update(**fields)
    return request


@pytest.fixture
def varied(shop, team):
    """Rows that take every branch of a list row: queued with and without a cycle's verdict (and with reasons of
    odd shapes), bare metal (no spec), a served model, a quota exception, other states."""
    bare_metal = factories.ServiceFactory(kind=ServiceKind.BARE_METAL, specs=[], images=[])
    serving = factories.ServiceFactory(kind=ServiceKind.MODEL_SERVING, specs=[shop.whole], images=[])
    reason = {"code": "capacity_in_use", "message": "Every matching card is in use.", "numbers": {"free": 0}}
    return [
        stored(shop, team, RequestState.QUEUED, queue_position=1, queue_reason=reason, queue_updated_at=SEEN),
        stored(shop, team, RequestState.QUEUED),  # not yet seen by a cycle: no position, no reason
        stored(shop, team, RequestState.QUEUED, queue_position=2, queue_reason={"code": 7}, queue_updated_at=SEEN),
        stored(shop, team, RequestState.QUEUED, queue_position=3, queue_reason=["not", "an", "object"]),
        stored(shop, team, RequestState.QUEUED, queue_position=4, queue_reason={"code": None, "message": 5}),
        stored(
            shop,
            team,
            RequestState.ACTIVE,
            service=bare_metal,
            spec=None,
            image=None,
            bare_metal_profile=factories.BareMetalProfileFactory(name="HGX node"),
        ),
        stored(
            shop,
            team,
            RequestState.PENDING_APPROVAL,
            service=serving,
            serving_model=factories.ServingModelFactory(name="Llama", version="3.1-70B"),
        ),
        stored(
            shop,
            team,
            RequestState.RELEASED,
            quota_exception=True,
            cost_estimate=Decimal("1234567.80"),
            gpu_equivalents=Decimal("0.1429"),
            priority="high",
            requester=team.developer2,
        ),
        stored(shop, team, RequestState.CANCELLED, created_at=SEEN),
        stored(shop, team, RequestState.WAITING_FOR_QUOTA),
    ]


def rendered(data) -> bytes:
    return JSONRenderer().render(data)


def each_through_drf(requests) -> bytes:
    return rendered([RequestSummarySerializer(request).data for request in requests])


def test_list_rows_are_what_the_summary_serializer_says_of_each_request(api_as, team, varied):
    page = api_as(team.operator).get("/api/v1/requests/", {"ordering": "id"}).json()

    expected = ResourceRequest.objects.order_by("id")
    assert page["count"] == len(varied)
    assert rendered(page["results"]) == each_through_drf(expected)


def test_queue_rows_are_what_the_summary_serializer_says_of_each_request(api_as, team, varied):
    page = api_as(team.developer).get("/api/v1/queue/").json()

    in_queue_order = [varied[0], varied[2], varied[3], varied[4], varied[1]]
    assert [row["id"] for row in page["results"]] == [request.pk for request in in_queue_order]
    fresh = ResourceRequest.objects.in_bulk([request.pk for request in in_queue_order])
    assert rendered(page["results"]) == each_through_drf(fresh[request.pk] for request in in_queue_order)


def test_list_rows_read_the_currency_at_each_call(api_as, team, varied, settings):
    client = api_as(team.operator)
    client.get("/api/v1/requests/")  # the rows' formatting fields are built once per process

    settings.CATALOG_CURRENCY = "EUR"

    assert {row["currency"] for row in client.get("/api/v1/requests/").json()["results"]} == {"EUR"}


def test_the_queue_page_takes_its_page_from_the_queue_order_index_without_sorting(team, varied):
    """An operator's queue page is every queued request: its ids come in queue order from request_queue_order_idx, as
    many entries as the page shows, not from sorting every queued row (6,000 at the load benchmark: 4-20 ms of
    PostgreSQL). A queue order the index does not serve would bring the sort back without failing any other test."""
    page_ids = queue_visible_to(user=team.operator).values("pk")[:50]
    with connection.cursor() as cursor:  # a handful of rows: the planner would otherwise read the table itself
        cursor.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
    plan = page_ids.explain()

    assert "request_queue_order_idx" in plan and "Sort" not in plan, plan
