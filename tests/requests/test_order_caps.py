"""Order caps (requests.order_caps): one account or one project cannot flood the queue. Open orders and orders waiting
for quota are capped per requester and per project (platform defaults, per-project overrides on the quota in the
console); a refusal is a 409 naming the cap, on the API and the order page, and stores nothing. Orders that wait
too long for quota are cancelled by the periodic sweep, with the reason on the timeline and a mail."""

from datetime import timedelta
from html import unescape

import pytest
import time_machine
from django.utils import timezone
from django_q.models import Schedule

from requests import services, tasks
from requests.choices import EventCode, OverQuota, RequestState
from requests.models import RequestEvent, ResourceRequest
from requests.schedules import WAITING_EXPIRY_TASK
from tenancy.models import AuditEvent, ProjectQuota
from tests.requests.conftest import make_order, order_post
from tests.requests.test_api import REQUESTS, order_body
from tests.smtp_server import text_of

pytestmark = pytest.mark.django_db


def _submit(shop, team, requester=None, over_quota=OverQuota.REJECT):
    return services.request_submit(
        order=make_order(shop, team.project), requester=requester or team.developer, over_quota=over_quota
    )


def _no_room(shop, team) -> None:
    """The project's GPUs are all held by one queued order of the lead's: every further order is over quota."""
    ProjectQuota.objects.filter(project=team.project).update(gpus=shop.whole.accelerator_count)
    _submit(shop, team, requester=team.lead)


def _caps(settings, **caps) -> None:
    for name in ("open_per_requester", "open_per_project", "waiting_per_requester", "waiting_per_project"):
        setattr(settings, f"ORDER_MAX_{name.upper()}", caps.get(name, 0))


def test_the_api_refuses_an_order_past_the_requesters_waiting_cap_naming_it_and_stores_nothing(
    api_as, shop, team, settings
):
    _caps(settings, waiting_per_requester=3)
    _no_room(shop, team)
    developer = api_as(team.developer)
    for _ in range(3):
        assert developer.post(REQUESTS, order_body(shop, team.project, over_quota="wait")).status_code == 201
    stored = ResourceRequest.objects.count()

    refused = developer.post(REQUESTS, order_body(shop, team.project, over_quota="wait"))

    assert refused.status_code == 409
    body = refused.json()
    assert body["code"] == "order_cap_reached"
    assert body["details"] == {"cap": "waiting_per_requester", "limit": 3, "current": 3, "project": team.project.slug}
    assert "orders waiting for quota per requester" in body["message"]
    assert ResourceRequest.objects.count() == stored
    # The cap is per requester: a teammate still waits, and an order that fits is not a waiting one.
    assert api_as(team.developer2).post(REQUESTS, order_body(shop, team.project, over_quota="wait")).status_code == 201


@pytest.mark.parametrize(
    ("cap", "requesters"),
    [("open_per_requester", ["developer", "developer"]), ("open_per_project", ["developer", "developer2"])],
)
def test_open_orders_are_capped_per_requester_and_per_project(shop, team, settings, cap, requesters):
    _caps(settings, **{cap: 2})
    for who in requesters:
        _submit(shop, team, requester=getattr(team, who))

    with pytest.raises(services.DomainError) as refusal:
        _submit(shop, team, requester=team.developer)

    assert (refusal.value.status_code, refusal.value.code) == (409, "order_cap_reached")
    assert refusal.value.details["cap"] == cap
    # An order that ended gives its place back.
    services.request_cancel(
        request=ResourceRequest.objects.filter(requester=team.developer).first(), actor=team.developer
    )
    assert _submit(shop, team).state == RequestState.QUEUED


def test_a_project_override_on_its_quota_beats_the_default_and_is_set_in_the_console_with_a_reason(
    client, shop, team, settings
):
    _caps(settings, open_per_requester=1)
    client.force_login(team.operator)
    quota = ProjectQuota.objects.get(project=team.project)
    page = client.get(f"/admin/tenancy/projectquota/{quota.pk}/change/")
    assert 'name="max_open_per_requester"' in page.content.decode()
    form = {field: getattr(quota, field) or "" for field in ("gpus", "accelerator_memory_gb", "cpu_cores")}
    form |= {field: getattr(quota, field) or "" for field in ("memory_gb", "concurrent_tasks", "monthly_card_hours")}
    form |= {"max_priority": quota.max_priority, "max_open_per_requester": 5, "reason": "hackathon week"}
    assert client.post(f"/admin/tenancy/projectquota/{quota.pk}/change/", form).status_code == 302

    for _ in range(5):
        _submit(shop, team)
    with pytest.raises(services.DomainError):
        _submit(shop, team)
    audit = AuditEvent.objects.get(action="quota.order_caps_changed")
    assert (audit.actor, audit.reason, audit.data) == (
        team.operator,
        "hackathon week",
        {"open_per_requester": [None, 5]},
    )


def test_the_order_page_shows_the_cap_as_the_refusal(client, shop, team, settings):
    _caps(settings, waiting_per_project=1)
    _no_room(shop, team)
    _submit(shop, team, over_quota=OverQuota.WAIT)
    client.force_login(team.developer2)

    page = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, over_quota="wait"))

    assert page.status_code == 422
    body = unescape(page.content.decode())
    assert 'data-code="order_cap_reached"' in body
    assert f"{team.project.name} has 1 orders waiting for quota, the most a project may have waiting" in body
    assert ResourceRequest.objects.count() == 2


def test_a_waiting_order_expires_after_the_operators_time_with_a_reason_and_a_mail(
    shop, team, settings, mailbox, django_capture_on_commit_callbacks
):
    settings.ORDER_WAITING_EXPIRY_HOURS = 48
    _caps(settings)
    _no_room(shop, team)
    with time_machine.travel(timezone.now() - timedelta(hours=49)):
        old = _submit(shop, team, over_quota=OverQuota.WAIT)
    recent = _submit(shop, team, over_quota=OverQuota.WAIT)
    assert "cancelled if still waiting after 48 hours" in old.events.get(code=EventCode.QUOTA_EXCEEDED).message

    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.expire_waiting() == 1

    old.refresh_from_db()
    recent.refresh_from_db()
    assert (old.state, recent.state) == (RequestState.CANCELLED, RequestState.WAITING_FOR_QUOTA)
    event = RequestEvent.objects.get(request=old, code=EventCode.WAITING_EXPIRED)
    assert (event.from_state, event.to_state, event.actor) == (
        RequestState.WAITING_FOR_QUOTA,
        RequestState.CANCELLED,
        None,
    )
    assert event.data["limit_hours"] == 48 and event.data["waited_hours"] == 49
    assert event.data["reasons"][0]["dimension"] == "gpus"  # what it was waiting for
    [mail] = mailbox.wait_for(1)
    assert mail["To"] == team.developer.email
    assert mail["Subject"] == f"Request #{old.pk} waited too long for quota and was cancelled"
    assert "Waited 49 hours for quota" in text_of(mail)
    assert tasks.expire_waiting() == 0  # nothing twice


def test_expiry_can_be_turned_off_and_runs_on_the_periodic_schedule(shop, team, settings):
    schedule = Schedule.objects.get(func=WAITING_EXPIRY_TASK)
    assert (schedule.schedule_type, schedule.minutes, schedule.repeats) == (Schedule.MINUTES, 5, -1)
    settings.ORDER_WAITING_EXPIRY_HOURS = 0
    _caps(settings)
    _no_room(shop, team)
    with time_machine.travel(timezone.now() - timedelta(days=400)):
        waiting = _submit(shop, team, over_quota=OverQuota.WAIT)
    assert tasks.expire_waiting() == 0
    waiting.refresh_from_db()
    assert waiting.state == RequestState.WAITING_FOR_QUOTA
