"""Inventory services (cordon, isolation, health) and the import_inventory command."""

import pytest

from config.errors import Conflict, DomainError
from requests.choices import EventCode
from scheduling import services
from scheduling.choices import DeviceHealth
from scheduling.models import Device, Node
from tenancy.models import AuditEvent
from tests import factories
from tests.scheduling.inventory_helpers import active_request, allocate, node

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator():
    return factories.operator()


# --- cordon / uncordon ---------------------------------------------------------------------------------


def test_cordon_and_uncordon_are_audited_with_reason_and_actor(operator):
    target = node()
    services.node_cordon(target, "Replacing PSU", operator)
    target.refresh_from_db()
    assert not target.schedulable and target.cordon_reason == "Replacing PSU"
    assert target.cordoned_by == operator and target.cordoned_at is not None
    audit = AuditEvent.objects.get(action="node.cordoned")
    assert audit.actor == operator and audit.reason == "Replacing PSU" and audit.target_id == str(target.pk)

    services.node_uncordon(target, "PSU replaced", operator)
    target.refresh_from_db()
    assert target.schedulable and target.cordon_reason == "" and target.cordoned_by is None
    audit = AuditEvent.objects.get(action="node.uncordoned")
    assert audit.reason == "PSU replaced" and audit.data == {"cordon_reason": "Replacing PSU"}


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_cordon_without_reason_is_refused_and_changes_nothing(operator, reason):
    target = node()
    with pytest.raises(DomainError) as refusal:
        services.node_cordon(target, reason, operator)
    assert refusal.value.code == "reason_required"
    assert Node.objects.get(pk=target.pk).schedulable
    assert not AuditEvent.objects.filter(action__startswith="node.").exists()


def test_uncordon_without_reason_is_refused(operator):
    target = services.node_cordon(node(), "Maintenance", operator)
    with pytest.raises(DomainError):
        services.node_uncordon(target, "", operator)
    assert not Node.objects.get(pk=target.pk).schedulable


def test_cordoning_twice_or_uncordoning_a_schedulable_node_is_a_conflict(operator):
    target = node()
    with pytest.raises(Conflict) as refusal:
        services.node_uncordon(target, "why not", operator)
    assert refusal.value.code == "not_cordoned"
    services.node_cordon(target, "Maintenance", operator)
    with pytest.raises(Conflict) as refusal:
        services.node_cordon(target, "Again", operator)
    assert refusal.value.code == "already_cordoned"
    assert Node.objects.get(pk=target.pk).cordon_reason == "Maintenance"


# --- isolation and health ------------------------------------------------------------------------------


def test_isolate_is_audited_with_reason_and_refused_without(operator):
    device = node(devices=1).devices.get()
    with pytest.raises(DomainError):
        services.device_isolate(device, "", actor=operator)
    assert not Device.objects.get(pk=device.pk).isolated
    services.device_isolate(device, "ECC double-bit errors", actor=operator)
    device.refresh_from_db()
    assert device.isolated and device.isolation_reason == "ECC double-bit errors" and device.isolated_at
    audit = AuditEvent.objects.get(action="device.isolated")
    assert audit.actor == operator and audit.reason == "ECC double-bit errors"


def test_isolating_an_isolated_device_changes_nothing(operator):
    device = node(devices=1).devices.get()
    services.device_isolate(device, "First", actor=operator)
    services.device_isolate(device, "Second", actor=None)
    assert Device.objects.get(pk=device.pk).isolation_reason == "First"
    assert AuditEvent.objects.filter(action="device.isolated").count() == 1


def test_isolation_is_noted_on_the_timeline_of_each_active_allocation_holding_the_device(operator):
    host = node(devices=2)
    first, second = host.devices.all()
    holder, bystander = active_request(), active_request()
    allocate(holder, [first], milli=500)
    allocate(bystander, [second])
    released = allocate(active_request(), [first], milli=250)
    released.state, released.released_at = "released", released.started_at
    released.save()

    services.device_isolate(first, "XID 48 (double-bit ECC)", actor=operator)

    [event] = holder.events.filter(code=EventCode.DEVICE_ISOLATED)
    assert first.uuid in event.message and "XID 48 (double-bit ECC)" in event.message
    assert event.actor == operator and event.from_state == event.to_state == "active"
    assert event.data["device"] == first.uuid and event.data["reason"] == "XID 48 (double-bit ECC)"
    assert not bystander.events.filter(code=EventCode.DEVICE_ISOLATED).exists()
    assert not released.request.events.filter(code=EventCode.DEVICE_ISOLATED).exists()
    assert AuditEvent.objects.get(action="device.isolated").data["affected_requests"] == [holder.pk]


def test_set_health_records_changes_only(operator):
    device = node(devices=1).devices.get()
    services.device_set_health(device, DeviceHealth.DEGRADED, "temp 91 C")
    services.device_set_health(device, DeviceHealth.DEGRADED, "temp 92 C")
    device.refresh_from_db()
    assert device.health == DeviceHealth.DEGRADED and device.health_detail == "temp 91 C"
    [audit] = AuditEvent.objects.filter(action="device.health_changed")
    assert audit.data == {"from": "healthy", "to": "degraded"}
    with pytest.raises(DomainError) as refusal:
        services.device_set_health(device, "on fire", "?")
    assert refusal.value.code == "invalid_health"
