"""The quota ledger from allocations, admission on used + committed remainder, budget alerts at 80% and 100%."""

from datetime import date
from decimal import Decimal

import pytest
import time_machine

from config import hooks as hook_registry
from metering import services
from metering.models import BudgetAlert
from requests import services as request_services
from requests.choices import NotificationKind, RequestState
from requests.notifications import notification_preferences_set
from requests.orders import Order
from requests.quota import usage_of
from requests.services import QuotaExceeded
from tenancy.models import AuditEvent, MonthlyUsage
from tests.metering.conftest import at, bound
from tests.smtp_server import text_of

pytestmark = pytest.mark.django_db

NOVEMBER, OCTOBER = date(2026, 11, 1), date(2026, 10, 1)
NOW = "2026-11-20 12:00"


def ledger(project) -> dict:
    return {
        f"{month:%Y-%m}": hours
        for month, hours in MonthlyUsage.objects.filter(project=project).values_list("month", "card_hours")
    }


def order(world, hours: int) -> Order:
    return Order(
        service=world.service, project=world.project, duration_hours=hours, spec=world.whole, image=world.image
    )


def test_ledger_holds_each_months_card_hours_running_allocations_up_to_now(world):
    bound(world, started=at("2026-10-31 22:00"), released=at("2026-11-01 01:00"))  # 2 h in October, 1 h in November
    bound(world, started=at("2026-11-20 09:00"))  # running: 3 h so far
    assert services.ledger_refresh(months=[OCTOBER, NOVEMBER], now=at(NOW)) == 2
    assert ledger(world.project) == {"2026-10": Decimal(4), "2026-11": Decimal(8)}
    services.ledger_refresh(months=[OCTOBER, NOVEMBER], now=at("2026-11-20 13:00"))  # again, an hour later
    assert ledger(world.project) == {"2026-10": Decimal(4), "2026-11": Decimal(10)}


def test_usage_refresh_covers_this_month_and_the_last(world):
    bound(world, started=at("2026-10-31 23:00"), released=at("2026-11-01 00:30"))
    services.usage_refresh(now=at("2026-11-01 06:00"))
    assert ledger(world.project) == {"2026-10": Decimal(2), "2026-11": Decimal(1)}


def test_admission_counts_metered_use_plus_the_unmetered_remainder_of_running_work(world):
    with time_machine.travel(at(NOW), tick=False):
        bound(world, started=at("2026-11-20 02:00"), hours=24)  # 2 cards x 24 h = 48 committed, 20 metered so far
        services.usage_refresh()
        assert ledger(world.project)["2026-11"] == Decimal(20)
        assert usage_of([world.project.pk])["monthly_card_hours"] == Decimal(48)  # 20 used + 28 still to come
        queued = request_services.request_submit(order=order(world, 26), requester=world.developer)  # 48 + 52 = 100
        assert queued.state == RequestState.QUEUED
        with pytest.raises(QuotaExceeded) as refusal:
            request_services.request_submit(order=order(world, 1), requester=world.developer)
    [reason] = refusal.value.details["reasons"]
    assert (reason["dimension"], Decimal(reason["used"]), Decimal(reason["limit"])) == (
        "monthly_card_hours",
        Decimal(100),
        Decimal(100),
    )


def test_ledger_holds_what_running_requests_metered_this_month_each_up_to_its_demand(world):
    first, second = world.node.devices.order_by("index")[:2]
    bound(world, spec=world.half, devices=[first], started=at("2026-11-20 02:00"))  # half a card x 10 h = 5 of 12
    bound(world, spec=world.half, devices=[second], started=at("2026-11-19 12:00"), hours=6)  # 12 h, demand 3
    bound(world, started=at("2026-11-19 00:00"), released=at("2026-11-19 06:00"))  # released: not running
    services.usage_refresh(now=at(NOW))
    running = dict(MonthlyUsage.objects.filter(project=world.project).values_list("month", "running_card_hours"))
    assert running == {NOVEMBER: Decimal(8)}  # 5 + 3, on this month's row


def test_monthly_card_hours_are_the_same_whichever_hooks_are_registered(world, monkeypatch):
    with time_machine.travel(at(NOW), tick=False):
        bound(world, started=at("2026-11-20 02:00"), hours=24)
        services.usage_refresh()
        with_metering = usage_of([world.project.pk])
        monkeypatch.setattr(hook_registry, "_registered", {})  # as if no higher app were installed
        assert usage_of([world.project.pk]) == with_metering
    assert with_metering["monthly_card_hours"] == Decimal(48)  # 20 metered + 28 still to come


def test_a_request_being_released_counts_only_what_it_used(world):
    with time_machine.travel(at(NOW), tick=False):
        allocation = bound(world, started=at("2026-11-20 02:00"), hours=24)
        request_services.request_release(request=allocation.request, actor=None, reason="done early")
        services.usage_refresh()
        assert usage_of([world.project.pk])["monthly_card_hours"] == Decimal(20)


def test_release_refreshes_the_ledger(world, django_capture_on_commit_callbacks):
    with time_machine.travel(at(NOW), tick=False):
        allocation = bound(world, started=at("2026-11-20 06:00"))
        with django_capture_on_commit_callbacks(execute=True):
            request_services.request_release(request=allocation.request, actor=None, reason="done")
    allocation.refresh_from_db()
    assert allocation.released_at is not None
    assert ledger(world.project)["2026-11"] == Decimal(12)  # 6 h x 2 cards, up to the release


def alerts(project) -> list[str]:
    return list(BudgetAlert.objects.filter(project=project).order_by("created_at").values_list("level", flat=True))


def test_budget_alerts_at_80_and_100_percent_once_each_with_an_audit_note(world):
    bound(world, started=at("2026-11-01 00:00"), released=at("2026-11-02 15:00"))  # 39 h x 2 cards = 78
    assert services.usage_refresh(now=at(NOW))["alerts"] == []
    bound(world, spec=world.half, started=at("2026-11-02 00:00"), released=at("2026-11-02 08:00"))  # + 4 = 82
    services.usage_refresh(now=at(NOW))
    services.usage_refresh(now=at(NOW))
    assert alerts(world.project) == ["warning"]
    audit = AuditEvent.objects.get(action="budget.warning")
    assert audit.target_id == str(world.project.pk) and "82.0 of its 100 card-hours" in audit.reason
    bound(world, started=at("2026-11-03 00:00"), released=at("2026-11-03 09:00"))  # + 18 = 100
    services.usage_refresh(now=at(NOW))
    assert alerts(world.project) == ["warning", "exhausted"]
    alert = BudgetAlert.objects.get(level="exhausted")
    assert (alert.month, alert.card_hours, alert.limit, alert.percent) == (NOVEMBER, 100, 100, 100)


def test_at_100_percent_new_requests_are_refused_and_running_work_keeps_running(world):
    with time_machine.travel(at(NOW), tick=False):
        running = bound(world, started=at("2026-11-18 12:00"), hours=60)  # 48 h so far: 96 used, 24 still to come
        bound(world, spec=world.half, started=at("2026-11-01 00:00"), released=at("2026-11-01 08:00"))  # 4 used
        services.usage_refresh()
        assert alerts(world.project) == ["warning", "exhausted"]
        with pytest.raises(QuotaExceeded) as refusal:
            request_services.request_submit(order=order(world, 1), requester=world.developer)
    assert refusal.value.code == "quota_exceeded"
    assert [reason["dimension"] for reason in refusal.value.details["reasons"]] == ["monthly_card_hours"]
    running.request.refresh_from_db()
    assert running.request.state == RequestState.ACTIVE


def test_policy_can_release_running_work_when_the_budget_is_used_up(world, settings):
    settings.METERING_BUDGET_RELEASES_RUNNING = True
    with time_machine.travel(at(NOW), tick=False):
        running = bound(world, started=at("2026-11-18 12:00"), hours=60)
        bound(world, spec=world.half, started=at("2026-11-01 00:00"), released=at("2026-11-01 08:00"))
        services.usage_refresh()
    running.request.refresh_from_db()
    assert running.request.state == RequestState.RELEASING
    assert "budget used up" in running.request.events.get(code="releasing").message


def test_projects_without_a_card_hour_budget_get_no_alerts(world):
    bound(world, project=world.other_project, started=at("2026-11-01 00:00"), released=at("2026-11-10 00:00"))
    services.usage_refresh(now=at(NOW))
    assert not BudgetAlert.objects.exists()


def test_the_lead_is_mailed_once_at_the_warning_share_operators_set_and_again_when_used_up(
    world, settings, mailbox, django_capture_on_commit_callbacks
):
    settings.METERING_BUDGET_WARNING_PERCENT = 50
    bound(world, started=at("2026-11-01 00:00"), released=at("2026-11-01 20:00"))  # 20 h x 2 cards = 40 of 100
    with django_capture_on_commit_callbacks(execute=True):
        assert services.usage_refresh(now=at(NOW))["alerts"] == []
    bound(world, started=at("2026-11-02 00:00"), released=at("2026-11-02 06:00"))  # + 12 = 52: past 50%
    for _ in range(2):  # a second refresh announces nothing new
        with django_capture_on_commit_callbacks(execute=True):
            services.usage_refresh(now=at(NOW))
    assert alerts(world.project) == ["warning"]
    [warned] = mailbox.wait_for(1)
    lead = world.project.lead
    assert warned["To"] == lead.email
    assert warned["Subject"] == f"{world.project.name}: 52% of its monthly card-hour budget used"
    assert "52.0 of its 100 card-hours for November 2026 (52%)" in text_of(warned)
    assert "https://compute.example.org/usage/" in text_of(warned)

    bound(world, started=at("2026-11-03 00:00"), released=at("2026-11-04 00:00"))  # + 48 = 100
    with django_capture_on_commit_callbacks(execute=True):
        services.usage_refresh(now=at(NOW))
    _, used_up = mailbox.wait_for(2)
    assert used_up["To"] == lead.email and "100%" in used_up["Subject"] and "running work goes on" in text_of(used_up)
    assert len(mailbox.subjects()) == 2  # nobody else: only the lead hears of the project's budget


def test_a_lead_who_turned_budget_mail_off_gets_none(world, settings, mailbox, django_capture_on_commit_callbacks):
    notification_preferences_set(user=world.project.lead, enabled=[], shown=[NotificationKind.BUDGET_WARNING])
    bound(world, started=at("2026-11-01 00:00"), released=at("2026-11-03 00:00"))  # 96 of 100
    with django_capture_on_commit_callbacks(execute=True):
        services.usage_refresh(now=at(NOW))
    assert alerts(world.project) == ["warning"] and mailbox.subjects() == []
