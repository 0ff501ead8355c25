"""Leads see what uses their quota: each dimension split into running, queued, reserved (awaiting approval) and
approved exceptions, card-hours also into this month's metered hours, adding up to what admission counts, with the
requests behind each part and a bar against the limit; the change form starts from the current limits."""

import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests.choices import RequestState
from requests.models import QuotaChangeRequest, ResourceRequest
from requests.quota import month_start, usage_of
from requests.quota_breakdown import quota_breakdown
from tenancy.models import MonthlyUsage
from tests import factories
from tests.requests.conftest import make_order
from tests.requests.lifecycle import stored_request

pytestmark = pytest.mark.django_db
S = RequestState


@pytest.fixture
def busy(shop, team):
    """Two running requests (one being released), a queued one, one awaiting approval, an approved quota exception,
    a released one (which uses nothing), and this month's ledger."""

    def stored(state, spec=None, **fields):
        made = stored_request(make_order(shop, team.project, spec=spec or shop.whole), team.developer, state)
        ResourceRequest.objects.filter(pk=made.pk).update(**fields)
        return made

    requests = {
        "active": stored(S.ACTIVE),
        "releasing": stored(S.RELEASING, spec=shop.sliced),
        "queued": stored(S.QUEUED, spec=shop.sliced),
        "pending": stored(S.PENDING_APPROVAL),
        "exception": stored(S.QUEUED, quota_exception=True),
        "released": stored(S.RELEASED),
    }
    MonthlyUsage.objects.create(
        project=team.project, month=month_start(), card_hours=Decimal("31.5"), running_card_hours=Decimal(6)
    )
    return requests


def _parts(breakdown, dimension) -> dict:
    row = next(row for row in breakdown.dimensions if row.dimension == dimension)
    return {segment.key: segment.amount for segment in row.segments}


def test_each_dimension_splits_into_running_queued_reserved_and_approved_exceptions(team, busy):
    breakdown = quota_breakdown(team.project)

    # whole spec: 2 cards, 16 cores; sliced: 0.1429 of a card, 4 cores (tests/requests/conftest.py:shop)
    assert _parts(breakdown, "gpus") == {
        "running": Decimal("2.1429"),
        "queued": Decimal("0.1429"),
        "reserved": Decimal(2),
        "exception": Decimal(2),
    }
    assert _parts(breakdown, "cpu_cores") == {"running": 20, "queued": 4, "reserved": 16, "exception": 16}
    assert _parts(breakdown, "concurrent_tasks") == {"running": 2, "queued": 1, "reserved": 1, "exception": 1}


def test_card_hours_add_the_month_s_metered_hours_and_count_running_work_once(team, busy):
    parts = _parts(quota_breakdown(team.project), "monthly_card_hours")

    # 10 h each: the active whole-card request 20 card-hours, of which 6 metered (in the ledger's 31.5 already); the
    # request being released counts in the ledger only; queued slice 1.429; pending 20; the exception 20.
    assert parts == {
        "metered": Decimal("31.5"),
        "running": Decimal(14),
        "queued": Decimal("1.429"),
        "reserved": Decimal(20),
        "exception": Decimal(20),
    }


def test_the_parts_add_up_to_what_admission_counts(team, busy):
    counted = usage_of([team.project.pk])

    for row in quota_breakdown(team.project).dimensions:
        assert row.used == counted[row.dimension], row.dimension


def test_the_page_shows_bars_against_the_limit_and_the_requests_behind_each_part(client, team, busy):
    client.force_login(team.lead)

    body = client.get(f"/projects/{team.project.pk}/quota/").content.decode()

    gpus = body[body.index('data-dimension="gpus"') :].split('data-dimension="accelerator_memory_gb"')[0]
    assert "6.29 of 16" in gpus and "(9.71 left)" in gpus
    assert gpus.count("<rect class=") == 6  # the track, four parts, the limit's mark
    assert '<li data-part="reserved"><span class="legend reserved"></span> Reserved 2</li>' in gpus
    for part, made in [("running", "active"), ("running", "releasing"), ("queued", "queued")]:
        section = body[body.index(f'id="part-{part}"') :].split("</section>")[0]
        assert f'data-request="{busy[made].pk}"' in section
    exceptions = body[body.index('id="part-exception"') :].split("</section>")[0]
    assert f'data-request="{busy["exception"].pk}"' in exceptions and f"#{busy['queued'].pk}<" not in exceptions
    assert f'data-request="{busy["released"].pk}"' not in body


def test_a_dimension_over_its_limit_is_marked(client, team, busy):
    team.project.quota.gpus = Decimal(4)
    team.project.quota.save()
    client.force_login(team.lead)

    body = client.get(f"/projects/{team.project.pk}/quota/").content.decode()

    assert 'data-dimension="gpus" data-over="true"' in body


def test_the_change_form_starts_from_the_current_limits_and_asks_for_what_changed(client, team):
    client.force_login(team.lead)
    page = client.get(f"/projects/{team.project.pk}/quota/").content.decode()
    shown = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page))
    assert shown["gpus"] == "16" and shown["cpu_cores"] == "256" and shown["concurrent_tasks"] == "10"

    response = client.post(
        f"/projects/{team.project.pk}/quota/",
        {
            **{key: value for key, value in shown.items() if key != "csrfmiddlewaretoken"},
            "gpus": "24",
            "justification": "More",
        },
    )

    assert response.status_code == 302
    assert QuotaChangeRequest.objects.get().limits == {"gpus": "24"}


def test_sending_the_current_limits_unchanged_is_refused_at_the_form(client, team):
    client.force_login(team.lead)
    page = client.get(f"/projects/{team.project.pk}/quota/").content.decode()
    shown = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page))

    response = client.post(f"/projects/{team.project.pk}/quota/", {**shown, "justification": "Same"})

    assert "These are the current limits: change at least one." in response.content.decode()
    assert not QuotaChangeRequest.objects.exists()


def test_a_link_s_proposal_overrides_the_current_limit_it_names(client, team):
    client.force_login(team.lead)

    page = client.get(f"/projects/{team.project.pk}/quota/?gpus=20").content.decode()

    shown = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page))
    assert shown["gpus"] == "20" and shown["cpu_cores"] == "256"


def test_members_see_the_breakdown_without_the_form_and_others_see_nothing(client, team, busy):
    client.force_login(team.developer)
    body = client.get(f"/projects/{team.project.pk}/quota/").content.decode()
    assert 'id="part-running"' in body and 'id="quota-change-form"' not in body

    client.force_login(factories.member(factories.project()))
    assert client.get(f"/projects/{team.project.pk}/quota/").status_code == 404


def _queries(client, path) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return len(queries)


def test_the_page_costs_the_same_queries_however_many_requests_use_the_quota(
    client, shop, team, busy, django_assert_max_num_queries
):
    client.force_login(team.lead)
    path = f"/projects/{team.project.pk}/quota/"
    few = _queries(client, path)
    for state in (S.ACTIVE, S.QUEUED, S.PENDING_APPROVAL) * 9:
        stored_request(make_order(shop, team.project, spec=shop.sliced), team.developer, state)

    with django_assert_max_num_queries(few):
        body = client.get(path).content.decode()
    assert "more in the request list" in body  # 10 listed of the 11 running


def test_an_emptied_field_asks_for_no_limit(client, team):
    client.force_login(team.lead)
    page = client.get(f"/projects/{team.project.pk}/quota/").content.decode()
    shown = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page))

    client.post(f"/projects/{team.project.pk}/quota/", {**shown, "memory_gb": "", "justification": "Uncap memory"})

    assert QuotaChangeRequest.objects.get().limits == {"memory_gb": None}
