"""Extending a running request: budget-checked, approved like a new order, the allocation's expiry moves."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests.choices import ApprovalMode, RequestState
from requests.models import ApprovalAssignment, RequestExtension
from scheduling import cycle, reclaim
from scheduling.models import Allocation
from tenancy.services import quota_set
from tests.requests.conftest import approval_rule, approver_stage
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(shop, team, django_capture_on_commit_callbacks):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    request = queued(shop, team)  # 10 hours, 2 cards
    with django_capture_on_commit_callbacks(execute=True):
        cycle.run_cycle()  # placed and provisioned (simulated): active
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    return request


def extend(api_as, user, request, hours=5, justification="The run needs another epoch"):
    return api_as(user).post(
        f"/api/v1/requests/{request.pk}/extend/", {"hours": hours, "justification": justification}, format="json"
    )


def test_extension_without_a_policy_applies_and_moves_the_expiry(
    api_as,
    team,  # noqa: F811
    running,
    django_capture_on_commit_callbacks,
):
    expires = Allocation.objects.get(request=running).expires_at
    with django_capture_on_commit_callbacks(execute=True):
        response = extend(api_as, team.developer, running)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["duration_hours"] == 15 and Decimal(body["card_hours"]) == Decimal(30)
    assert Allocation.objects.get(request=running).expires_at == expires + timedelta(hours=5)
    assert [e["code"] for e in body["timeline"]][-2:] == ["extension_requested", "extended"]
    assert running.extensions.get().state == "applied"


def test_an_extension_writes_the_request_and_never_the_allocation(
    api_as,
    team,  # noqa: F811
    running,
    django_capture_on_commit_callbacks,
):
    """The allocation's end is derived from the request's duration: request and allocation cannot disagree."""
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        assert extend(api_as, team.developer, running).status_code == 200
    writes = [query["sql"] for query in queries if query["sql"].startswith(("UPDATE", "INSERT", "DELETE"))]
    assert not [sql for sql in writes if '"scheduling_allocation"' in sql.split(" SET ")[0]]
    assert len([sql for sql in writes if sql.startswith('UPDATE "requests_resourcerequest"')]) == 1


def test_an_extension_gets_its_own_expiry_warning_before_the_new_end(api_as, team, running):  # noqa: F811
    start = Allocation.objects.get(request=running).term_started_at
    with time_machine.travel(start + timedelta(hours=7), tick=False):  # the 4-hour window of a 10-hour run
        assert (reclaim.warn_expiring(), reclaim.warn_expiring()) == (1, 0)
        assert extend(api_as, team.developer, running).status_code == 200  # now 15 hours
        assert reclaim.warn_expiring() == 0  # the new end is 8 hours away
    with time_machine.travel(start + timedelta(hours=12), tick=False):
        assert (reclaim.warn_expiring(), reclaim.warn_expiring()) == (1, 0)
    warnings = running.events.filter(code="expiry_warning").order_by("id")
    assert [event.data["expires_at"] for event in warnings] == [
        (start + timedelta(hours=10)).isoformat(),
        (start + timedelta(hours=15)).isoformat(),
    ]
    assert not reclaim.reclaim_expired(now=start + timedelta(hours=14))


def test_extension_waits_for_the_same_approvers_as_an_order(
    api_as,
    team,  # noqa: F811
    running,
    django_capture_on_commit_callbacks,
):
    approval_rule(approver_stage(mode=ApprovalMode.ANY))
    extend(api_as, team.developer, running)
    extension = running.extensions.get()
    assert extension.state == "pending_approval"
    task = ApprovalAssignment.objects.get(approver=team.approver, decision="")
    with django_capture_on_commit_callbacks(execute=True):
        assert api_as(team.approver).post(f"/api/v1/approvals/{task.pk}/approve/", {}, format="json").status_code == 200
    extension.refresh_from_db()
    running.refresh_from_db()
    assert extension.state == "applied" and running.duration_hours == 15


def test_extension_over_the_monthly_card_hours_is_refused(api_as, team, running):  # noqa: F811
    quota_set(quota=team.project.quota, limits={"monthly_card_hours": Decimal(25)}, actor=None)
    response = extend(api_as, team.developer, running)  # 20 committed + 2 cards x 5 h = 30 > 25
    assert response.status_code == 409 and response.json()["code"] == "quota_exceeded"
    assert response.json()["details"]["reasons"][0]["dimension"] == "monthly_card_hours"
    assert not RequestExtension.objects.exists()


def test_extension_beyond_the_service_maximum_is_a_422(api_as, team, running):  # noqa: F811
    response = extend(api_as, team.developer, running, hours=1000)
    assert response.status_code == 422 and response.json()["code"] == "duration_out_of_range"


def test_only_running_requests_and_their_owners_may_extend(api_as, shop, team, running):  # noqa: F811
    assert extend(api_as, team.approver, running).status_code == 403
    waiting = queued(shop, team)
    assert extend(api_as, team.developer, waiting).status_code == 409
    assert extend(api_as, team.developer, running, justification="").status_code == 400


def test_extension_from_the_request_page(client, team, running, django_capture_on_commit_callbacks):  # noqa: F811
    client.force_login(team.developer)
    assert b"Ask for more time" in client.get(f"/requests/{running.pk}/").content
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/requests/{running.pk}/extend/", {"hours": "4", "justification": "one more epoch"})
    running.refresh_from_db()
    assert running.duration_hours == 14
    response = client.post(f"/requests/{running.pk}/extend/", {"hours": "x", "justification": "?"}, follow=True)
    assert b"whole number" in response.content
