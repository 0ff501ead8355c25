"""The request list copes with volume: a date column, state, project and spec filters, search, pagination in a
constant number of queries, and a default per role (an approver does not land on an empty "Mine")."""

import re
from copy import copy

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests import services
from requests.choices import RequestState
from requests.models import ResourceRequest
from tenancy.choices import Role
from tests import factories
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db


def _listed(client, query="") -> list[int]:
    response = client.get(f"/requests/{query}")
    assert response.status_code == 200
    return [int(pk) for pk in re.findall(r'<tr data-request="(\d+)"', response.content.decode())]


def _submitted(shop, project, requester, **overrides) -> ResourceRequest:
    return services.request_submit(order=make_order(shop, project, **overrides), requester=requester)


def _copies(resource_request: ResourceRequest, count: int) -> list[ResourceRequest]:
    """`count` more rows like the request (what a busy project's list holds), written at once."""
    rows = []
    for _ in range(count):
        row = copy(resource_request)
        row.pk = row.id = None
        row.idempotency_key = ""
        rows.append(row)
    return ResourceRequest.objects.bulk_create(rows)


@pytest.fixture
def listed(shop, team):
    """A request of each developer, and one of another project the team cannot see."""
    mine = _submitted(shop, team.project, team.developer)
    theirs = _submitted(shop, team.project, team.developer2, spec=shop.sliced)
    elsewhere = factories.project()
    outsider = factories.member(elsewhere)
    hidden = _submitted(shop, elsewhere, outsider)
    return mine, theirs, hidden


def test_a_developer_starts_with_their_own_requests(client, team, listed):
    mine, theirs, _ = listed
    client.force_login(team.developer)

    assert _listed(client) == [mine.pk]
    assert _listed(client, "?mine=0") == [theirs.pk, mine.pk]


@pytest.mark.parametrize("who", ["approver", "lead", "operator"])
def test_people_who_look_after_requests_start_with_every_request_they_may_see(client, team, listed, who):
    mine, theirs, hidden = listed
    client.force_login(getattr(team, who))

    shown = _listed(client)

    assert shown == ([hidden.pk] if who == "operator" else []) + [theirs.pk, mine.pk]
    assert 'id="requests-empty"' not in client.get("/requests/").content.decode()


def test_the_list_has_a_date_column(client, team, listed):
    mine, _, _ = listed
    client.force_login(team.developer)

    body = client.get("/requests/").content.decode()

    assert '<th scope="col">Submitted</th>' in body
    assert f'<time datetime="{mine.created_at.isoformat()}"' in body


def test_state_project_and_spec_filters_narrow_the_list(client, shop, team, listed):
    mine, theirs, _ = listed
    other_project = factories.project(quota={"gpus": 16, "cpu_cores": 256, "memory_gb": 2048})
    factories.member(other_project, user=team.approver, role=Role.APPROVER)
    factories.member(other_project, user=team.developer)
    elsewhere = _submitted(shop, other_project, team.developer)
    services.request_cancel(request=mine, actor=team.developer, reason="")
    client.force_login(team.approver)

    assert _listed(client, f"?state={RequestState.CANCELLED}") == [mine.pk]
    assert _listed(client, f"?project={other_project.pk}") == [elsewhere.pk]
    assert _listed(client, f"?spec={shop.sliced.pk}") == [theirs.pk]
    assert _listed(client, f"?spec={shop.whole.pk}&project={team.project.pk}") == [mine.pk]


def test_search_finds_by_number_words_and_people(client, shop, team, listed):
    mine, theirs, _ = listed
    team.developer2.first_name, team.developer2.last_name = "Ada", "Lovelace"
    team.developer2.save()
    client.force_login(team.approver)

    assert _listed(client, f"?q=%23{mine.pk}") == [mine.pk]
    assert _listed(client, "?q=lovelace") == [theirs.pk]
    assert _listed(client, f"?q={shop.sliced.name.split()[0]}+ada") == [theirs.pk]
    assert _listed(client, "?q=nothing-like-this") == []
    assert "No requests match these filters" in client.get("/requests/?q=nothing-like-this").content.decode()


@pytest.mark.parametrize(
    "query", ["?state=bogus", "?project=abc", "?spec=999999", "?page=zzz", "?page=-3", "?mine=2", f"?q={'x' * 500}"]
)
def test_values_the_filters_cannot_take_filter_nothing_and_never_fail(client, team, listed, query):
    client.force_login(team.approver)

    assert len(_listed(client, query)) == 2


def test_pages_of_fifty_keep_the_filters(client, shop, team, listed):
    mine, _, _ = listed
    _copies(mine, 119)
    client.force_login(team.developer)

    first = client.get("/requests/?state=queued").content.decode()

    assert len(_listed(client, "?state=queued")) == 50
    assert "1\u201350 of 120 requests" in first  # an en dash
    assert 'href="?state=queued&amp;page=2" rel="next"' in first
    assert len(_listed(client, "?state=queued&page=3")) == 20
    assert len(_listed(client, "?state=queued&page=99")) == 20  # past the end: the last page


def _queries(client, path) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return len(queries)


@pytest.mark.parametrize("path", ["/requests/", "/requests/?q=spec&state=queued&page=2", "/requests/?mine=1"])
def test_a_page_of_the_list_costs_the_same_queries_however_many_requests_there_are(
    client, team, listed, django_assert_max_num_queries, path
):
    mine, theirs, _ = listed
    client.force_login(team.approver)
    few = _queries(client, path)
    _copies(mine, 80)
    _copies(theirs, 80)

    with django_assert_max_num_queries(few):
        assert client.get(path).status_code == 200
    assert few <= 14
