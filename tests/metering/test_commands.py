"""Operator command and demo seed of metering."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from metering.demo import HISTORY
from metering.models import DailyUsage, TelemetrySample
from metering.selectors import recommendations, zero_touch_kpi
from requests.models import ResourceRequest
from tenancy.models import MonthlyUsage, User
from tests.metering.conftest import at, bound

pytestmark = pytest.mark.django_db


def test_metering_refresh_collects_rolls_up_and_refreshes_the_ledger(world, frozen):
    bound(world, started=at("2026-11-20 06:00"))
    out = StringIO()
    call_command("metering_refresh", collect=True, stdout=out)
    report = json.loads(out.getvalue())
    assert report["telemetry"] == {"samples": 2, "errors": []}
    assert report["rollup_rows"] == 1 and report["ledger_rows"] == 1
    assert TelemetrySample.objects.count() == 2 and DailyUsage.objects.count() == 1
    assert MonthlyUsage.objects.get(project=world.project).card_hours == 12


def test_demo_history_is_seeded_once_with_advice_and_a_kpi(settings):
    settings.DEBUG = True
    call_command("seed_demo", stdout=StringIO())
    history = ResourceRequest.objects.filter(justification=HISTORY)
    assert history.count() == 11 and DailyUsage.objects.exists()
    operator = User.objects.get(username="operator")
    [advice] = recommendations(user=operator)
    assert advice.evidence.project == "vision" and "8x H100 80GB SXM requested 4 times" in advice.message
    months = sorted(
        {
            row["month"]
            for row in zero_touch_kpi(
                user=operator,
                first_month=history.earliest("created_at").created_at.date().replace(day=1),
                last_month=history.latest("created_at").created_at.date(),
            )
        }
    )
    assert months
    call_command("seed_demo", stdout=StringIO())
    assert ResourceRequest.objects.filter(justification=HISTORY).count() == 11
