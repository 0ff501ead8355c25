"""Degraded cards recover: rules say when (readings clear for N minutes), operators mark them healthy (audited)."""

import importlib
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.apps import apps as django_apps
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.exceptions import ValidationError

from config.errors import Conflict, DomainError
from scheduling import services
from scheduling.choices import Comparison, DeviceHealth, HealthAction, HealthSource
from scheduling.inventory.health import RECOVER, HealthSample, health_ingest, reads_clear
from scheduling.models import Device, HealthEvent, HealthRule
from scheduling.signals import health_changed
from tenancy.models import AuditEvent
from tests import factories
from tests.scheduling.health_inventory import HOSTNAME, UUIDS, device, gpu_node, ingest_user

pytestmark = pytest.mark.django_db

TEMP = "DCGM_FI_DEV_GPU_TEMP"
SEEDED_TEMP_RULE = "GPU temperature 90 C or more degrades"
START = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
URL = "/api/v1/health/events/"


def temp(value, uuid=UUIDS[0]):
    return HealthSample(source=HealthSource.DCGM, signal=TEMP, value=value, device_uuid=uuid)


def bmc(value):
    return HealthSample(source=HealthSource.BMC, signal="Status.Health", value=value, node=HOSTNAME, index=0)


def at(minutes: float, *samples):
    """Ingest the samples `minutes` after START, as an exporter scraping then would."""
    with time_machine.travel(START + timedelta(minutes=minutes), tick=False):
        return health_ingest(list(samples))


def health(uuid=UUIDS[0]) -> str:
    return device(uuid).health


@pytest.fixture
def card():
    gpu_node()
    at(0, temp(95))
    assert health() == DeviceHealth.DEGRADED
    return device(UUIDS[0])


# --- the seeded temperature rule: degrade at >= 90, clear below 85 for 10 minutes -----------------------------


def test_the_seeded_temperature_rule_says_when_a_card_recovers():
    rule = HealthRule.objects.get(name=SEEDED_TEMP_RULE)
    assert (rule.recovery_threshold, rule.recover_after_minutes) == ("85", 10)
    assert HealthRule.objects.get(name="BMC health Warning degrades").recover_after_minutes == 10


def test_a_hot_card_returns_to_healthy_after_ten_cool_minutes(card):
    """The issue's case: before the fix a 45 C reading matched no rule and the card stayed degraded for ever."""
    assert device(UUIDS[0]).degraded_by.name == SEEDED_TEMP_RULE
    at(1, temp(45))
    assert health() == DeviceHealth.DEGRADED and device(UUIDS[0]).clear_since == START + timedelta(minutes=1)
    at(10, temp(44))
    assert health() == DeviceHealth.DEGRADED  # 9 minutes clear so far
    report = at(11, temp(45))
    recovered = device(UUIDS[0])
    assert (recovered.health, recovered.degraded_by, recovered.clear_since) == (DeviceHealth.HEALTHY, None, None)
    assert "Recovered" in recovered.health_detail
    [outcome] = report.devices
    assert (outcome.uuid, outcome.action, outcome.changed, outcome.health) == (UUIDS[0], RECOVER, True, "healthy")
    audit = AuditEvent.objects.filter(action="device.health_changed", target_id=str(card.pk)).latest("id")
    assert audit.data["from"] == "degraded" and audit.data["to"] == "healthy"
    assert audit.data["code"] == "recovered" and audit.data["rule"] == SEEDED_TEMP_RULE
    assert audit.data["recover_after_minutes"] == 10


def test_readings_between_the_thresholds_are_not_clear(card):
    for minute in range(1, 30, 5):
        at(minute, temp(87))  # below 90 (no rule), not below 85
    assert health() == DeviceHealth.DEGRADED and device(UUIDS[0]).clear_since is None


@pytest.mark.parametrize("interruption", [95, 87])
def test_a_reading_that_is_not_clear_starts_the_clock_again(card, interruption):
    at(1, temp(45))
    at(6, temp(interruption))
    at(7, temp(45))
    at(16, temp(45))
    assert health() == DeviceHealth.DEGRADED  # only 9 minutes since the clock started again
    at(17, temp(45))
    assert health() == DeviceHealth.HEALTHY


def test_other_signals_and_other_cards_are_no_evidence(card):
    power = HealthSample(source=HealthSource.DCGM, signal="DCGM_FI_DEV_POWER_USAGE", value=100, device_uuid=UUIDS[0])
    at(1, power, temp(45, UUIDS[1]))
    at(30, power, temp(45, UUIDS[1]))
    assert health() == DeviceHealth.DEGRADED and device(UUIDS[0]).clear_since is None


def test_an_isolated_card_never_recovers_on_its_own(card):
    services.device_isolate(card, "XID 79 after the overheating")
    for minute in range(1, 60, 10):
        at(minute, temp(40))
    assert (health(), device(UUIDS[0]).isolated) == (DeviceHealth.DEGRADED, True)


def test_isolation_stops_the_clock_so_recovery_starts_over_after_the_clearance(card):
    at(1, temp(45))
    services.device_isolate(card, "Fan replaced, burn-in pending")
    assert device(UUIDS[0]).clear_since is None


def test_a_rule_without_recovery_leaves_the_card_to_an_operator(card):
    HealthRule.objects.filter(name=SEEDED_TEMP_RULE).update(recover_after_minutes=None, recovery_threshold="")
    at(1, temp(45))
    at(60, temp(45))
    assert health() == DeviceHealth.DEGRADED


def test_zero_minutes_recovers_at_the_first_clear_reading(card):
    HealthRule.objects.filter(name=SEEDED_TEMP_RULE).update(recover_after_minutes=0)
    at(1, temp(80))
    assert health() == DeviceHealth.HEALTHY


def test_a_bmc_warning_clears_when_the_bmc_reads_ok_for_ten_minutes():
    gpu_node()
    at(0, bmc("Warning"))
    at(5, bmc("OK"))
    at(14, bmc("OK"))
    assert health() == DeviceHealth.DEGRADED
    at(15, bmc("OK"))
    assert health() == DeviceHealth.HEALTHY


def test_the_newest_degrading_signal_is_the_one_that_must_clear(card):
    at(1, bmc("Warning"))
    assert device(UUIDS[0]).degraded_by.name == "BMC health Warning degrades"
    at(2, temp(45))
    at(30, temp(45))  # the temperature is fine, the BMC warning has not cleared
    assert health() == DeviceHealth.DEGRADED


def test_recovery_wakes_the_scheduler_after_the_commit(card, django_capture_on_commit_callbacks):
    received = []

    def receiver(**kwargs):
        received.append(kwargs["device_ids"])

    health_changed.connect(receiver, dispatch_uid="test-recovery-wakes")
    try:
        at(1, temp(45))
        with django_capture_on_commit_callbacks(execute=True):
            at(11, temp(45))
        assert received == [[card.pk]]
    finally:
        health_changed.disconnect(dispatch_uid="test-recovery-wakes")


def test_recovery_through_the_api_is_reported_per_device(api_as, card):
    agent = api_as(ingest_user())
    event = {"device_uuid": UUIDS[0], "source": "dcgm", "signal": TEMP, "value": 45}
    with time_machine.travel(START + timedelta(minutes=1), tick=False):
        assert agent.post(URL, {"events": [event]}, format="json").json()["devices"] == []
    with time_machine.travel(START + timedelta(minutes=11), tick=False):
        body = agent.post(URL, {"events": [event]}, format="json").json()
    assert body["devices"] == [
        {
            "uuid": UUIDS[0],
            "node": HOSTNAME,
            "index": 0,
            "action": "recover",
            "changed": True,
            "health": "healthy",
            "isolated": False,
        }
    ]


# --- pure: what counts as clear ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recovery_threshold", "value", "clear"),
    [
        ("85", 84.9, True),
        ("85", 85, False),
        ("85", 92, False),
        ("", 89, True),
        ("", "hot", False),
        ("", None, False),
    ],
)
def test_reads_clear(recovery_threshold, value, clear):
    rule = HealthRule(
        name="t",
        source=HealthSource.DCGM,
        signal=TEMP,
        comparison=Comparison.GTE,
        threshold="90",
        action=HealthAction.DEGRADE,
        recovery_threshold=recovery_threshold,
        recover_after_minutes=5,
    )
    assert reads_clear(rule, temp(value)) is clear


# --- rules that cannot work are refused -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "error_field"),
    [
        ({"action": HealthAction.ISOLATE, "recover_after_minutes": 10}, "recover_after_minutes"),
        ({"recovery_threshold": "95", "recover_after_minutes": 10}, "recovery_threshold"),  # above the threshold
        ({"recovery_threshold": "nan", "recover_after_minutes": 10}, "recovery_threshold"),
        ({"recovery_threshold": "80"}, "recover_after_minutes"),  # a threshold without a hold time
        (
            {
                "comparison": Comparison.EQ,
                "threshold": "Warning",
                "recovery_threshold": "1",
                "recover_after_minutes": 1,
            },
            "recovery_threshold",
        ),
        ({"threshold": "inf"}, "threshold"),
        ({"recover_after_minutes": 7 * 24 * 60 + 1}, "recover_after_minutes"),
    ],
)
def test_impossible_recovery_settings_are_refused(fields, error_field):
    rule = HealthRule(
        **{
            "name": "r",
            "source": HealthSource.DCGM,
            "signal": TEMP,
            "comparison": Comparison.GTE,
            "threshold": "90",
            "action": HealthAction.DEGRADE,
            **fields,
        }
    )
    with pytest.raises(ValidationError) as refused:
        rule.full_clean()
    assert error_field in refused.value.message_dict


# --- operators mark a degraded card healthy -------------------------------------------------------------------


def test_an_operator_marks_a_degraded_card_healthy_with_a_reason(card):
    operator = factories.operator()
    services.device_mark_healthy(card, "Blocked air intake cleared", operator)
    healed = device(UUIDS[0])
    assert (healed.health, healed.degraded_by, healed.clear_since) == (DeviceHealth.HEALTHY, None, None)
    audit = AuditEvent.objects.filter(action="device.health_changed", actor=operator).get()
    assert audit.reason.endswith("Blocked air intake cleared")
    assert audit.data["code"] == "marked_healthy" and audit.data["degraded_by"] == SEEDED_TEMP_RULE


def test_marking_an_isolated_card_healthy_is_refused_and_changes_nothing(card):
    services.device_isolate(card, "XID 79")
    with pytest.raises(Conflict) as refused:
        services.device_mark_healthy(card, "Looks fine", factories.operator())
    assert refused.value.code == "device_isolated" and "second operator" in refused.value.message
    assert (health(), device(UUIDS[0]).isolated) == (DeviceHealth.DEGRADED, True)


def test_marking_a_healthy_card_or_without_a_reason_is_refused(card):
    healthy = device(UUIDS[1])
    with pytest.raises(Conflict) as refused:
        services.device_mark_healthy(healthy, "Looks fine", factories.operator())
    assert refused.value.code == "device_not_degraded"
    with pytest.raises(DomainError) as refused:
        services.device_mark_healthy(card, "  ", factories.operator())
    assert refused.value.code == "reason_required" and health() == DeviceHealth.DEGRADED


def _mark_healthy(client, devices, reason="Reseated the card"):
    data = {"action": "mark_healthy", "_selected_action": [obj.pk for obj in devices], "apply": "1", "reason": reason}
    return client.post("/admin/scheduling/device/", data, follow=True)


def test_the_admin_action_marks_degraded_cards_healthy_and_names_each_refusal(client, card):
    operator = factories.operator()
    client.force_login(operator)
    isolated = device(UUIDS[1])
    at(1, temp(95, UUIDS[1]))
    services.device_isolate(isolated, "XID 79")
    assert "mark_healthy" in client.get("/admin/scheduling/device/").content.decode()
    response = _mark_healthy(client, [card, isolated])
    texts = [message.message for message in get_messages(response.wsgi_request)]
    assert any(str(isolated) in text and "isolated" in text for text in texts)
    assert any("Marked healthy 1 device" in text for text in texts)
    assert health() == DeviceHealth.HEALTHY
    assert (health(UUIDS[1]), device(UUIDS[1]).isolated) == (DeviceHealth.DEGRADED, True)
    assert AuditEvent.objects.filter(action="device.health_changed", actor=operator).count() == 1


@pytest.mark.parametrize("who", [None, "developer", "other_developer", "approver", "lead"])
def test_nobody_but_operators_can_mark_a_card_healthy(client, roles, card, who):
    if who is not None:
        client.force_login(getattr(roles, who))
    response = _mark_healthy(client, [card])
    assert response.redirect_chain and "/admin/login/" in response.redirect_chain[-1][0]
    assert health() == DeviceHealth.DEGRADED
    assert not AuditEvent.objects.filter(action="device.health_changed", data__code="marked_healthy").exists()


def test_staff_without_the_change_permission_get_no_action(client, card):
    viewer = factories.UserFactory(is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label="scheduling", codename="view_device"))
    client.force_login(viewer)
    assert "mark_healthy" not in client.get("/admin/scheduling/device/").content.decode()
    _mark_healthy(client, [card])
    assert health() == DeviceHealth.DEGRADED and Device.objects.get(pk=card.pk).degraded_by is not None


def test_the_migration_tells_cards_degraded_before_it_which_rule_did_it():
    migration = importlib.import_module("scheduling.migrations.0006_health_recovery")
    gpu_node()
    rule = HealthRule.objects.get(name=SEEDED_TEMP_RULE)
    old = Device.objects.filter(uuid__in=UUIDS[:2])
    old.update(health=DeviceHealth.DEGRADED)  # as ingestion left them before the migration: no rule remembered
    HealthEvent.objects.create(
        device=device(UUIDS[0]),
        rule=rule,
        source=HealthSource.DCGM,
        signal=TEMP,
        value="95",
        action=HealthAction.DEGRADE,
    )
    migration.add_recovery_defaults(django_apps, None)
    assert device(UUIDS[0]).degraded_by == rule
    assert device(UUIDS[1]).degraded_by is None  # no degrade event: an operator marks it healthy
