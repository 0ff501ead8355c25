"""Switching a card between MIG and whole mode respects running work: a node's report or an operator's switch is
refused with the allocations named while work runs on the card, or, when the operator asks for a drain, the card
takes no new work and switches once the last of it is released. Never silently; the device form cannot do it."""

import pytest
from django.contrib.messages import get_messages

from config.errors import DomainError
from requests.choices import RequestState
from scheduling import cycle, reclaim
from scheduling.mig import SEEDED
from scheduling.mig import services as mig_services
from scheduling.models import MigInstance
from tenancy.models import AuditEvent
from tests.scheduling import test_mig_cycle
from tests.scheduling.agent_tokens import agent_api
from tests.scheduling.fake_nvidia_smi import FakeGpu, FakeHost
from tests.scheduling.inventory_helpers import active_request, allocate
from tests.scheduling.test_cycle import queued

pytestmark = pytest.mark.django_db
shop, team = test_mig_cycle.shop, test_mig_cycle.team

LAYOUT_URL = "/api/v1/health/mig-layout/"
DEVICES_URL = "/admin/scheduling/device/"


def whole_card_running(shop):
    """An H100 in whole mode with a whole-card allocation running on it."""
    device = test_mig_cycle.h100_node(shop).devices.get()
    return device, allocate(active_request(), [device], milli=1000)


def test_a_node_report_that_switches_a_card_under_running_work_is_refused_naming_it(shop):
    device, running = whole_card_running(shop)
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_layout_report(device=device, mig_mode=True, instances=[], source="agent", actor=None)
    assert error.value.code == "mig_mode_change_in_use"
    assert f"allocation {running.pk} (request #{running.request_id})" in error.value.message
    assert error.value.details["allocations"] == [{"allocation": running.pk, "request": running.request_id}]
    device.refresh_from_db()
    assert not device.mig_mode
    # the same through the agents' endpoint: that card is refused, by name, and nothing changes
    response = agent_api(nodes=[device.node]).post(
        LAYOUT_URL, {"devices": [{"uuid": device.uuid, "mig_mode": True, "instances": []}]}, format="json"
    )
    assert response.status_code == 200
    (refused,) = response.json()["refused"]
    assert refused["code"] == "mig_mode_change_in_use" and refused["details"]["allocations"][0]["allocation"]
    device.refresh_from_db()
    assert not device.mig_mode


def test_the_console_switch_is_refused_while_work_runs_and_says_which(shop, console, operator):
    device, running = whole_card_running(shop)
    page = console.post(DEVICES_URL, {"action": "switch_to_mig_mode", "_selected_action": [device.pk]})
    assert page.status_code == 200 and f"#{running.request_id}" in page.content.decode()  # the blast radius first
    response = console.post(
        DEVICES_URL,
        {"action": "switch_to_mig_mode", "_selected_action": [device.pk], "apply": "1", "reason": "inference pool"},
        follow=True,
    )
    texts = [message.message for message in get_messages(response.wsgi_request)]
    assert any(f"allocation {running.pk} (request #{running.request_id})" in text for text in texts), texts
    device.refresh_from_db()
    assert not device.mig_mode and device.mig_mode_wanted == ""
    assert not AuditEvent.objects.filter(action__startswith="device.mig_mode").exists()


def test_a_drained_switch_keeps_new_work_off_the_card_and_switches_when_the_work_ends(shop, team, operator):
    device, running = whole_card_running(shop)
    mig_services.device_mig_mode_switch(
        device=device, mig_mode=True, reason="inference pool", actor=operator, drain=True
    )
    device.refresh_from_db()
    assert (device.mig_mode, device.mig_mode_wanted) == (False, "mig")
    assert AuditEvent.objects.get(action="device.mig_mode_drain").data["allocations"] == [running.pk]
    reclaim.allocation_free(request_ids=[running.request_id], reason="done")
    waiting = queued(shop, team, spec=shop.specs["3g.40gb"])
    device.refresh_from_db()
    assert (device.mig_mode, device.mig_mode_wanted) == (True, "")
    switched = AuditEvent.objects.get(action="device.mig_mode_switched")
    assert switched.data["commands"] == [["nvidia-smi", "-i", "0", "-mig", "1"]]
    cycle.run_cycle()
    waiting.refresh_from_db()
    assert waiting.state != RequestState.QUEUED  # the card takes work again, in its new mode


def test_a_card_being_drained_takes_no_new_work(shop, team, operator):
    """A running 3g.40gb at memory slices 0-3 leaves room for another at 4: while the card drains for whole mode,
    neither that slice nor a whole card goes there."""
    device = test_mig_cycle.h100_node(shop).devices.get()
    mig_services.device_mig_layout_report(
        device=device,
        mig_mode=True,
        instances=[{"profile": "3g.40gb", "start": 0, "gi_id": 2}],
        source="agent",
        actor=None,
    )
    running = allocate(active_request(), [device], milli=428)
    MigInstance.objects.filter(device=device).update(allocation=running)
    mig_services.device_mig_mode_switch(
        device=device, mig_mode=False, reason="training pool", actor=operator, drain=True
    )
    slice_order = queued(shop, team, spec=shop.specs["3g.40gb"])
    whole_order = queued(shop, team, spec=shop.whole)
    cycle.run_cycle()
    slice_order.refresh_from_db()
    whole_order.refresh_from_db()
    assert slice_order.state == whole_order.state == RequestState.QUEUED
    assert list(MigInstance.objects.values_list("start", flat=True)) == [0]
    mig_services.device_mig_mode_switch(device=device, mig_mode=True, reason="changed my mind", actor=operator)
    cycle.run_cycle()  # the switch withdrawn, the card takes slices again
    slice_order.refresh_from_db()
    assert slice_order.state != RequestState.QUEUED


def test_a_switch_with_nothing_running_applies_at_once_and_the_idle_instances_go(shop, operator):
    device = test_mig_cycle.h100_node(shop).devices.get()
    mig_services.device_mig_layout_report(
        device=device,
        mig_mode=True,
        instances=[{"profile": "3g.40gb", "start": 0, "gi_id": 2}],
        source="agent",
        actor=None,
    )
    mig_services.device_mig_mode_switch(device=device, mig_mode=False, reason="training pool", actor=operator)
    device.refresh_from_db()
    assert not device.mig_mode and not MigInstance.objects.exists()
    switched = AuditEvent.objects.get(action="device.mig_mode_switched")
    assert switched.data["commands"] == [
        ["nvidia-smi", "mig", "-i", "0", "-gi", "2", "-dci"],
        ["nvidia-smi", "mig", "-i", "0", "-dgi", "-gi", "2"],
        ["nvidia-smi", "-i", "0", "-mig", "0"],
    ]
    host = FakeHost(FakeGpu(0, SEEDED["H100 80GB"], mig_mode=True))  # what the node runs, on a card that checks
    host.add_instance(0, "3g.40gb", 0, gi_id=2)
    host.run_all(switched.data["commands"])
    assert not host.gpus[0].mig_mode and host.gpus[0].layout() == []
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_mode_switch(device=device, mig_mode=False, reason="again", actor=operator)
    assert error.value.code == "mig_mode_unchanged"


def test_a_pinned_layout_or_a_card_without_mig_is_not_switched(shop, operator):
    from tests.scheduling.inventory_helpers import node

    device = test_mig_cycle.h100_node(shop).devices.get()
    mig_services.node_mig_pin(device.node, "fixed inference layout", operator)
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_mode_switch(device=device, mig_mode=True, reason="x", actor=operator)
    assert error.value.code == "mig_layout_pinned"
    plain = node(devices=1).devices.get()
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_mode_switch(device=plain, mig_mode=True, reason="x", actor=operator)
    assert error.value.code == "not_mig_capable"


def test_the_device_form_no_longer_flips_the_mode(shop, console):
    device, _running = whole_card_running(shop)
    data = {
        "node": device.node_id,
        "index": device.index,
        "uuid": device.uuid,
        "serial_number": device.serial_number,
        "model": device.model_id,
        "memory_gb": device.memory_gb,
        "mig_mode": "on",
        "mig_mode_wanted": "mig",
    }
    console.post(f"{DEVICES_URL}{device.pk}/change/", data)
    device.refresh_from_db()
    assert not device.mig_mode and device.mig_mode_wanted == ""
