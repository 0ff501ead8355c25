"""Health rules and ingestion: the pure matching, dcgm-exporter parsing, and health_ingest on PostgreSQL."""

import pytest

from scheduling.choices import Comparison, DeviceHealth, HealthAction, HealthSource
from scheduling.engine import HEALTHY, INSUFFICIENT_HEALTHY_CAPACITY, ISOLATED, Demand, place
from scheduling.inventory.health import (
    MATCHED,
    NO_RULE,
    UNKNOWN_DEVICE,
    HealthSample,
    InvalidTelemetry,
    evaluate,
    health_ingest,
    parse_dcgm_text,
    rule_matches,
)
from scheduling.models import Device, HealthEvent, HealthRule
from scheduling.readings import MAX_MAGNITUDE, number_problem
from scheduling.signals import health_changed
from tenancy.models import AuditEvent
from tests.scheduling.health_inventory import DCGM_TEXT, HOSTNAME, UUIDS, device, gpu_node, ingest_user

XID = "DCGM_FI_DEV_XID_ERRORS"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
TEMP = "DCGM_FI_DEV_GPU_TEMP"


def rule(comparison, threshold, action=HealthAction.ISOLATE, source=HealthSource.DCGM, signal=XID, **kwargs):
    return HealthRule(
        name=f"{signal} {comparison} {threshold}",
        source=source,
        signal=signal,
        comparison=comparison,
        threshold=threshold,
        action=action,
        **kwargs,
    )


def dcgm(signal, value, uuid=UUIDS[0]):
    return HealthSample(source=HealthSource.DCGM, signal=signal, value=value, device_uuid=uuid)


def bmc(value, node=HOSTNAME, index=None):
    return HealthSample(source=HealthSource.BMC, signal="Status.Health", value=value, node=node, index=index)


# --- pure: numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (91, None),
        (-40.5, None),
        ("79", None),
        (MAX_MAGNITUDE, None),
        (2**64, None),
        ("Critical", None),
        (True, None),
        (float("nan"), "is not a number (NaN)"),
        ("NaN", "is not a number (NaN)"),
        (float("inf"), "is infinite"),
        (float("-inf"), "is infinite"),
        ("+Inf", "is infinite"),
        ("1e400", "is infinite"),
        (1e308, "is beyond ±1.84e+19"),
        (2**64 + 1, "is beyond ±1.84e+19"),
        (-(10**400), "is beyond ±1.84e+19"),
    ],
)
def test_number_problem(value, problem):
    assert number_problem(value) == problem


def test_an_infinite_threshold_never_matches():
    assert not rule_matches(rule(Comparison.GT, "-inf", signal=TEMP), dcgm(TEMP, 45))


# --- pure: rules ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comparison", "threshold", "value", "expected"),
    [
        (Comparison.GT, "0", 1, True),
        (Comparison.GT, "0", 0, False),
        (Comparison.GT, "0", "3", True),  # numbers sent as text still compare as numbers
        (Comparison.GTE, "90", 90.0, True),
        (Comparison.GTE, "90", 89.9, False),
        (Comparison.EQ, "79", 79.0, True),
        (Comparison.EQ, "79", 48, False),
        (Comparison.EQ, "Critical", "critical", True),  # text compares without case
        (Comparison.EQ, "Critical", "Warning", False),
        (Comparison.IN, "48,63,64,79", 79.0, True),
        (Comparison.IN, "48, 63, 64, 79", "63", True),
        (Comparison.IN, "48,63,64,79", 13, False),
        (Comparison.IN, "48,63,64,79", 0, False),
        (Comparison.GT, "0", "not a number", False),
        (Comparison.GT, "0", float("nan"), False),
        (Comparison.GTE, "90", True, False),  # a boolean is not a temperature
    ],
)
def test_each_comparison(comparison, threshold, value, expected):
    assert rule_matches(rule(comparison, threshold), dcgm(XID, value)) is expected


def test_a_rule_matches_only_its_own_source_and_signal():
    xid_rule = rule(Comparison.GT, "0")
    assert not rule_matches(xid_rule, dcgm(DBE, 5))
    assert not rule_matches(xid_rule, HealthSample(source=HealthSource.AGENT, signal=XID, value=79, node="n"))


def test_isolate_beats_degrade_and_inactive_rules_are_ignored():
    degrade = rule(Comparison.GTE, "1", HealthAction.DEGRADE)
    isolate = rule(Comparison.IN, "79")
    assert evaluate(dcgm(XID, 79), [degrade, isolate]) is isolate
    assert evaluate(dcgm(XID, 13), [degrade, isolate]) is degrade
    assert evaluate(dcgm(XID, 0), [degrade, isolate]) is None
    isolate.active = False
    assert evaluate(dcgm(XID, 79), [degrade, isolate]) is degrade


# --- pure: dcgm-exporter text ------------------------------------------------------------------------------


def test_dcgm_exporter_text_parses_to_one_sample_per_gpu_and_metric():
    samples = parse_dcgm_text(DCGM_TEXT)
    assert len(samples) == 25 * 4
    by_key = {(sample.signal, sample.index): sample for sample in samples}
    xid = by_key[(XID, 1)]
    assert (xid.value, xid.device_uuid, xid.node) == (79.0, UUIDS[1], HOSTNAME)
    # counters keep their names as written (prometheus_client alone would report DBE samples as ..._TOTAL_total)
    assert by_key[(DBE, 3)].value == 2.0
    assert (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0)) in by_key
    assert by_key[(TEMP, 2)].value == 91.0
    assert {sample.source for sample in samples} == {HealthSource.DCGM}


def test_dcgm_samples_without_uuid_name_the_device_by_hostname_and_gpu():
    text = f'# TYPE {XID} gauge\n{XID}{{gpu="2",device="nvidia2",Hostname="{HOSTNAME}",err_code="48"}} 48\n'
    (sample,) = parse_dcgm_text(text)
    assert (sample.device_uuid, sample.node, sample.index, sample.value) == ("", HOSTNAME, 2, 48.0)


@pytest.mark.parametrize(
    "text",
    [
        "this is not prometheus {",
        f'{XID}{{gpu="0" 79',
        f"{XID} seventy-nine",
        "# HELP only a comment\n",
        "",
    ],
)
def test_text_that_is_not_the_exposition_format_is_refused(text):
    with pytest.raises(ValueError):
        parse_dcgm_text(text)


# --- service ----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_default_rules_are_seeded():
    rules = {(r.source, r.signal, r.comparison, r.threshold, r.action) for r in HealthRule.objects.filter(active=True)}
    assert {
        ("dcgm", DBE, "gt", "0", "isolate"),
        ("dcgm", XID, "in", "48,63,64,79", "isolate"),
        ("dcgm", TEMP, "gte", "90", "degrade"),
        ("bmc", "Status.Health", "eq", "Critical", "isolate"),
        ("bmc", "Status.Health", "eq", "Warning", "degrade"),
    } <= rules


@pytest.mark.django_db
def test_xid_79_isolates_the_card_at_once():
    gpu_node()
    agent = ingest_user()
    report = health_ingest([dcgm(XID, 79.0, UUIDS[1])], actor=agent)

    card = device(UUIDS[1])
    assert card.isolated and card.health == DeviceHealth.HEALTHY  # isolation is the flag; health stays as reported
    assert "DCGM_FI_DEV_XID_ERRORS=79" in card.isolation_reason and card.isolated_at is not None
    event = HealthEvent.objects.get(device=card)
    assert (event.signal, event.value, event.action, event.rule.signal) == (XID, "79", "isolate", XID)
    audit = AuditEvent.objects.get(action="device.isolated", target_id=str(card.pk))
    assert audit.actor == agent
    assert [(d.uuid, d.action, d.changed, d.isolated) for d in report.devices] == [(UUIDS[1], "isolate", True, True)]
    assert [e.outcome for e in report.events] == [MATCHED]
    assert not device(UUIDS[0]).isolated  # only that card


@pytest.mark.django_db
def test_an_isolated_card_gets_no_new_placement():
    from scheduling.cycle import load_snapshot

    gpu_node()
    health_ingest([dcgm(XID, 79, UUIDS[1])])

    snapshot = load_snapshot().snapshot
    (node,) = snapshot.nodes
    assert [d.health for d in node.devices] == [
        HEALTHY,
        ISOLATED,
        HEALTHY,
        HEALTHY,
    ]
    model = node.devices[0].model
    four = Demand(id="four", count=4, models=frozenset([model]))
    three = Demand(id="three", count=3, models=frozenset([model]))
    assert place(snapshot, [four]).pending[0].reason == INSUFFICIENT_HEALTHY_CAPACITY
    (binding,) = place(snapshot, [three]).bindings
    assert 1 not in {index for index, _ in binding.devices}


@pytest.mark.django_db
def test_a_double_bit_ecc_error_isolates():
    gpu_node()
    health_ingest([dcgm(DBE, 1, UUIDS[3]), dcgm(DBE, 0, UUIDS[2])])
    assert device(UUIDS[3]).isolated
    assert not device(UUIDS[2]).isolated
    assert HealthEvent.objects.filter(signal=DBE).count() == 1  # a zero count matches no rule: nothing recorded


@pytest.mark.django_db
def test_a_hot_gpu_is_degraded_not_isolated():
    gpu_node()
    report = health_ingest([dcgm(TEMP, 90, UUIDS[0]), dcgm(TEMP, 89, UUIDS[1])])
    hot, cool = device(UUIDS[0]), device(UUIDS[1])
    assert (hot.health, hot.isolated) == (DeviceHealth.DEGRADED, False)
    assert "DCGM_FI_DEV_GPU_TEMP=90" in hot.health_detail
    assert cool.health == DeviceHealth.HEALTHY
    assert [e.outcome for e in report.events] == [MATCHED, NO_RULE]


@pytest.mark.django_db
def test_bmc_critical_isolates_every_device_of_the_node_and_warning_degrades():
    gpu_node()
    other = gpu_node("dgx-a-02", ["GPU-other-0", "GPU-other-1"])
    health_ingest([bmc("Critical")])
    assert all(d.isolated for d in gpu_node_devices(HOSTNAME))
    assert HealthEvent.objects.filter(source="bmc").count() == 4

    health_ingest([bmc("Warning", other.name)])
    assert all(d.health == DeviceHealth.DEGRADED and not d.isolated for d in gpu_node_devices(other.name))


@pytest.mark.django_db
def test_bmc_health_of_one_device_and_ok_does_nothing():
    gpu_node()
    health_ingest([bmc("OK"), bmc("Critical", index=2)])
    assert [d.isolated for d in gpu_node_devices(HOSTNAME)] == [False, False, True, False]


@pytest.mark.django_db
def test_the_strongest_action_wins_per_device():
    gpu_node()
    report = health_ingest([dcgm(TEMP, 95, UUIDS[0]), dcgm(XID, 48, UUIDS[0]), bmc("Warning")])
    first = device(UUIDS[0])
    assert first.isolated and first.health == DeviceHealth.HEALTHY  # only the strongest action applies
    assert "XID" in first.isolation_reason
    assert {d.uuid: d.action for d in report.devices}[UUIDS[0]] == "isolate"
    assert device(UUIDS[1]).health == DeviceHealth.DEGRADED


@pytest.mark.django_db
def test_the_full_dcgm_scrape():
    gpu_node()
    report = health_ingest(parse_dcgm_text(DCGM_TEXT))
    states = [(d.health, d.isolated) for d in gpu_node_devices(HOSTNAME)]
    assert states == [
        (DeviceHealth.HEALTHY, False),
        (DeviceHealth.HEALTHY, True),
        (DeviceHealth.DEGRADED, False),
        (DeviceHealth.HEALTHY, True),
    ]
    assert sum(e.outcome == MATCHED for e in report.events) == 3
    assert not report.unknown


@pytest.mark.django_db
def test_the_same_sample_twice_isolates_once():
    gpu_node()
    health_ingest([dcgm(XID, 79, UUIDS[1])])
    card = device(UUIDS[1])
    isolated_at = card.isolated_at
    audits = AuditEvent.objects.filter(target_id=str(card.pk)).count()

    report = health_ingest([dcgm(XID, 79, UUIDS[1])])
    card.refresh_from_db()
    assert card.isolated_at == isolated_at
    assert AuditEvent.objects.filter(target_id=str(card.pk)).count() == audits
    assert [(d.changed, d.isolated) for d in report.devices] == [(False, True)]
    assert HealthEvent.objects.filter(device=card).count() == 2  # the event itself is history


@pytest.mark.django_db
def test_a_degrade_leaves_an_isolated_card_isolated():
    gpu_node()
    health_ingest([dcgm(XID, 79, UUIDS[1])])
    report = health_ingest([dcgm(TEMP, 95, UUIDS[1])])
    card = device(UUIDS[1])
    assert (card.health, card.isolated) == (DeviceHealth.DEGRADED, True)
    assert (report.devices[0].action, report.devices[0].changed) == ("degrade", True)
    assert health_ingest([dcgm(TEMP, 95, UUIDS[1])]).devices[0].changed is False


@pytest.mark.django_db
def test_unknown_devices_are_reported_not_dropped():
    gpu_node(uuids=UUIDS[:2])
    samples = [
        dcgm(XID, 79, "GPU-not-in-inventory"),
        bmc("Critical", "no-such-node"),
        HealthSample(source=HealthSource.DCGM, signal=XID, value=79, node=HOSTNAME, index=7),
        dcgm(XID, 79, UUIDS[0]),
    ]
    report = health_ingest(samples)
    assert [e.outcome for e in report.events] == [UNKNOWN_DEVICE, UNKNOWN_DEVICE, UNKNOWN_DEVICE, MATCHED]
    assert report.unknown == [
        {"device_uuid": "GPU-not-in-inventory"},
        {"node": "no-such-node"},
        {"node": HOSTNAME, "index": 7},
    ]
    assert device(UUIDS[0]).isolated


@pytest.mark.django_db
def test_a_stale_uuid_falls_back_to_hostname_and_gpu():
    gpu_node()
    sample = HealthSample(
        source=HealthSource.DCGM, signal=XID, value=64, device_uuid="GPU-replaced-card", node=HOSTNAME, index=2
    )
    report = health_ingest([sample])
    assert device(UUIDS[2]).isolated
    assert report.events[0].devices == [UUIDS[2]]


@pytest.mark.django_db
def test_operators_edit_the_rules():
    gpu_node()
    HealthRule.objects.filter(signal=TEMP).update(threshold="85")
    HealthRule.objects.create(
        name="Agent: NVLink down isolates",
        source=HealthSource.AGENT,
        signal="nvlink_down",
        comparison=Comparison.EQ,
        threshold="true",
        action=HealthAction.ISOLATE,
    )
    health_ingest(
        [
            dcgm(TEMP, 86, UUIDS[0]),
            HealthSample(source=HealthSource.AGENT, signal="nvlink_down", value=True, device_uuid=UUIDS[1]),
        ]
    )
    assert device(UUIDS[0]).health == DeviceHealth.DEGRADED
    assert device(UUIDS[1]).isolated

    HealthRule.objects.filter(signal=XID).update(active=False)
    health_ingest([dcgm(XID, 79, UUIDS[2])])
    assert not device(UUIDS[2]).isolated


@pytest.mark.django_db
def test_health_changed_is_sent_after_commit_only_when_something_changed(django_capture_on_commit_callbacks):
    gpu_node()
    received = []

    def receiver(**kwargs):
        received.append((kwargs["device_ids"], kwargs["isolated_ids"]))

    health_changed.connect(receiver, dispatch_uid="test-health-changed")
    try:
        with django_capture_on_commit_callbacks() as callbacks:
            health_ingest([dcgm(XID, 79, UUIDS[1]), dcgm(TEMP, 92, UUIDS[2])])
        assert received == []  # nothing before the commit
        for callback in callbacks:
            callback()
        card, hot = device(UUIDS[1]), device(UUIDS[2])
        assert received == [([card.pk, hot.pk], [card.pk])]

        with django_capture_on_commit_callbacks(execute=True):  # the readings still go to metering, after commit
            health_ingest([dcgm(XID, 79, UUIDS[1]), dcgm(TEMP, 20, UUIDS[0])])
        assert received == [([card.pk, hot.pk], [card.pk])]  # no second health_changed
    finally:
        health_changed.disconnect(dispatch_uid="test-health-changed")


def gpu_node_devices(name):
    return list(Device.objects.filter(node__name=name).order_by("index"))


@pytest.mark.django_db
def test_ingest_refuses_a_batch_with_one_unusable_number_before_touching_anything():
    gpu_node()
    with pytest.raises(InvalidTelemetry) as refused:
        health_ingest([dcgm(XID, 79, UUIDS[1]), dcgm(TEMP, float("inf"), UUIDS[2])])
    assert refused.value.details["samples"][0]["position"] == 1
    assert not HealthEvent.objects.exists() and not device(UUIDS[1]).isolated
