"""Operator console for inventory: changelists in constant queries, read-only operational fields, actions."""

import pytest
from django.contrib.messages import get_messages

from scheduling import cycle, services
from scheduling.choices import DeviceHealth, HealthAction, HealthSource
from scheduling.models import Block, Device, HealthEvent, HealthRule, IsolationClearance, Node, Rack
from tenancy.models import AuditEvent
from tests import factories
from tests.queries import queries_for
from tests.scheduling.inventory_helpers import active_request, allocate, clearance_holder, node, rack

pytestmark = pytest.mark.django_db

MODELS = [
    "site",
    "block",
    "rack",
    "node",
    "device",
    "allocation",
    "allocationdevice",
    "isolationclearance",
    "healthrule",
    "healthevent",
]


def _url(model: str, suffix: str = "") -> str:
    return f"/admin/scheduling/{model}/{suffix}"


def _clearance_row():
    device = node(devices=1, rack=rack()).devices.get()
    services.device_isolate(device=device, reason="XID 79")
    requester = clearance_holder()
    clearance_holder()
    return services.isolation_clearance_request(device=device, reason="Reseated", actor=requester)


def _health_row():
    device = node(devices=1).devices.get()
    rule = HealthRule.objects.create(
        name=f"rule {device.pk}", source=HealthSource.DCGM, signal="XID", threshold="0", action=HealthAction.ISOLATE
    )
    return HealthEvent.objects.create(
        device=device, rule=rule, source=HealthSource.DCGM, signal="XID", value="79", action=HealthAction.ISOLATE
    )


def _allocation_row():
    host = node(devices=2, rack=rack())
    return allocate(active_request(), list(host.devices.all()), milli=500)


ROW_MAKERS = {
    "site": lambda: rack().site,
    "block": lambda: Block.objects.create(site=rack().site, name=f"b{Block.objects.count()}"),
    "rack": rack,
    "node": lambda: node(rack=rack()),
    "device": lambda: node(devices=3),
    "allocation": _allocation_row,
    "allocationdevice": _allocation_row,
    "isolationclearance": _clearance_row,
    "healthrule": lambda: HealthRule.objects.create(
        name=f"r{HealthRule.objects.count()}",
        source=HealthSource.BMC,
        signal="Status",
        comparison="in",
        threshold="Critical",
        action=HealthAction.DEGRADE,
    ),
    "healthevent": _health_row,
}


@pytest.mark.parametrize("model", MODELS)
def test_changelist_query_count_does_not_grow_with_rows(console, model):
    ROW_MAKERS[model]()
    few = queries_for(console, _url(model))
    for _ in range(4):
        ROW_MAKERS[model]()
    assert queries_for(console, _url(model)) == few


@pytest.mark.parametrize("model", ["node", "device"])
def test_change_form_query_count_is_bounded(console, model, django_assert_max_num_queries):
    host = node(devices=6, rack=rack())
    obj = host if model == "node" else host.devices.first()
    with django_assert_max_num_queries(30):
        assert console.get(_url(model, f"{obj.pk}/change/")).status_code == 200


def test_developer_gets_no_inventory_console(client):
    developer = factories.member(factories.project())
    client.force_login(developer)
    assert client.get(_url("node")).status_code == 302  # not staff: sent to the admin login


def test_node_list_shows_capacity_and_badge(console, operator):
    host = node(devices=4, rack=rack("dc9", "r1"))
    first = host.devices.first()
    allocate(active_request(), [first], milli=500)
    services.device_isolate(device=host.devices.last(), reason="ECC")
    services.node_cordon(node=node(name="cordoned-1"), reason="PSU", actor=operator)
    page = console.get(_url("node")).content.decode()
    assert "dc9/r1" in page and "64" in page and "256" in page
    assert "0.5 / 2.5" in page  # 0.5 card allocated; free: 4 cards - 0.5 - the isolated one
    assert "cordoned" in page and "schedulable" in page
    assert 'id="capacity-link"' in page


def test_capacity_view(console):
    node(devices=2)
    page = console.get(_url("node", "capacity/"))
    assert page.status_code == 200
    assert "Free cards" in page.content.decode()


def _rack_in_block(site: str, block: str, name: str) -> Rack:
    placed = rack(site, name)
    placed.block, _ = Block.objects.get_or_create(site=placed.site, name=block)
    placed.save(update_fields=["block"])
    return placed


def test_capacity_tree_shows_free_cards_per_site_block_and_rack_in_constant_queries(console):
    first = node(devices=4, rack=_rack_in_block("dc1", "spine-a", "r1"))
    node(devices=4, rack=_rack_in_block("dc1", "spine-a", "r2"))
    node(devices=2)  # no rack
    allocate(active_request(), [first.devices.first()], milli=500)  # a card in use is not free for a gang
    services.device_isolate(device=first.devices.last(), reason="ECC")
    url = _url("node", "capacity/")
    few = queries_for(console, url)
    page = console.get(url).content.decode()
    assert 'data-level="site" data-domain="dc1" data-free="6"' in page
    assert 'data-level="block" data-domain="spine-a" data-free="6"' in page
    assert 'data-level="rack" data-domain="r1" data-free="2"' in page
    assert 'data-level="rack" data-domain="r2" data-free="4"' in page
    assert 'data-level="rack" data-domain="(no rack)" data-free="2"' in page
    for number in range(3, 8):
        node(devices=4, rack=_rack_in_block("dc2", f"spine-{number}", f"r{number}"))
    assert queries_for(console, url) == few


def test_operators_edit_a_racks_block_and_the_engine_sees_it(console):
    placed = rack("dc1", "r1")
    block = Block.objects.create(site=placed.site, name="spine-a")
    host = node(devices=1, rack=placed)
    response = console.post(
        _url("rack", f"{placed.pk}/change/"), {"site": placed.site.pk, "name": "r1", "block": block.pk}
    )
    assert response.status_code == 302
    [view] = [n for n in cycle.load_inventory() if n.name == host.name]
    assert (view.site, view.block, view.rack) == ("dc1", "spine-a", "r1")


def test_node_form_cannot_uncordon_or_change_cordon_fields(console, operator):
    host = services.node_cordon(node=node(), reason="Maintenance", actor=operator)
    data = {
        "name": host.name,
        "serial_number": host.serial_number,
        "rack": "",
        "topology_domain": "new-island",
        "execution_backend": host.execution_backend,
        "cpu_milli": host.cpu_milli,
        "memory_mib": host.memory_mib,
        "bmc_address": "",
        "bmc_credentials_ref": "",
        "schedulable": "on",
        "cordon_reason": "",
        "devices-TOTAL_FORMS": "2",
        "devices-INITIAL_FORMS": "2",
        "devices-MIN_NUM_FORMS": "0",
        "devices-MAX_NUM_FORMS": "1000",
        **{f"devices-{i}-id": str(device.pk) for i, device in enumerate(host.devices.all())},
        **{f"devices-{i}-node": str(host.pk) for i in range(2)},
    }
    response = console.post(_url("node", f"{host.pk}/change/"), data)
    assert response.status_code == 302, response.content.decode()[:3000]
    host.refresh_from_db()
    assert host.topology_domain == "new-island"
    assert not host.schedulable and host.cordon_reason == "Maintenance"
    assert AuditEvent.objects.get(action="node.updated").data == {"fields": ["topology_domain"]}


def test_device_form_cannot_touch_health_isolation_or_allocated_shares(console):
    device = node(devices=1).devices.get()
    data = {
        "node": device.node_id,
        "index": 0,
        "uuid": device.uuid,
        "model": device.model_id,
        "memory_gb": 40,
        "health": DeviceHealth.UNHEALTHY,
        "isolated": "on",
        "isolation_reason": "x",
        "allocated_milli": 700,
    }
    response = console.post(_url("device", f"{device.pk}/change/"), data)
    assert response.status_code == 302
    device.refresh_from_db()
    assert device.memory_gb == 40
    assert device.health == DeviceHealth.HEALTHY and not device.isolated and device.allocated_milli == 0


def _act(console, model, action, objects, reason=None):
    data = {"action": action, "_selected_action": [obj.pk for obj in objects]}
    if reason is not None:
        data.update(apply="1", reason=reason)
    return console.post(_url(model), data, follow=reason is not None)


def test_cordon_action_asks_for_a_reason_then_cordons_through_the_service(console, operator):
    nodes = [node(), node()]
    page = _act(console, "node", "cordon_nodes", nodes)
    assert page.status_code == 200 and "reason" in page.content.decode()
    assert Node.objects.filter(schedulable=True).count() == 2
    response = _act(console, "node", "cordon_nodes", nodes, reason="Firmware rollout")
    assert response.status_code == 200
    assert set(Node.objects.values_list("schedulable", "cordon_reason")) == {(False, "Firmware rollout")}
    assert AuditEvent.objects.filter(action="node.cordoned", actor=operator).count() == 2
    # uncordon one; the other reports its refusal by name
    services.node_uncordon(node=nodes[1], reason="done early", actor=operator)
    response = _act(console, "node", "uncordon_nodes", nodes, reason="Rollout done")
    texts = [message.message for message in get_messages(response.wsgi_request)]
    assert any(nodes[1].name in text and "not cordoned" in text for text in texts)
    assert Node.objects.filter(schedulable=True).count() == 2


def test_empty_reason_changes_nothing(console):
    target = node()
    response = _act(console, "node", "cordon_nodes", [target], reason="")
    assert response.status_code == 200
    assert Node.objects.get(pk=target.pk).schedulable


def test_isolate_action(console, operator):
    devices = list(node(devices=2).devices.all())
    _act(console, "device", "isolate_devices", devices, reason="Burn-in failures")
    assert set(Device.objects.values_list("isolated", "isolation_reason")) == {(True, "Burn-in failures")}
    assert AuditEvent.objects.filter(action="device.isolated", actor=operator).count() == 2


def test_clearance_action_hidden_without_the_dedicated_permission(console):
    node(devices=1)
    page = console.get(_url("device")).content.decode()
    assert "isolate_devices" in page and "request_isolation_clearance" not in page
    device = Device.objects.get()
    services.device_isolate(device=device, reason="XID")
    _act(console, "device", "request_isolation_clearance", [device], reason="Reseated")
    assert not IsolationClearance.objects.exists()


def test_clearance_action_requests_and_reports_refusals_per_row(client):
    holder, _second = clearance_holder(), clearance_holder()
    client.force_login(holder)
    isolated, healthy = node(devices=2).devices.all()
    services.device_isolate(device=isolated, reason="XID 79")
    assert "request_isolation_clearance" in client.get(_url("device")).content.decode()
    response = _act(client, "device", "request_isolation_clearance", [isolated, healthy], reason="Reseated")
    texts = [message.message for message in get_messages(response.wsgi_request)]
    assert any(str(healthy) in text and "not isolated" in text for text in texts)
    assert any("Requested clearance of 1 device" in text for text in texts)
    [clearance] = IsolationClearance.objects.all()
    assert clearance.device == isolated and clearance.requested_by == holder
    assert Device.objects.get(pk=isolated.pk).isolated


def test_history_admins_are_read_only(console):
    clearance = _clearance_row()
    assert console.get(_url("isolationclearance", f"{clearance.pk}/change/")).status_code == 200
    assert console.post(_url("isolationclearance", f"{clearance.pk}/change/"), {"reason": "x"}).status_code == 403
    assert console.get(_url("allocation", "add/")).status_code == 403


def test_health_rule_is_editable_and_audited(console):
    rule = ROW_MAKERS["healthrule"]()
    data = {
        "name": rule.name,
        "source": rule.source,
        "signal": rule.signal,
        "comparison": rule.comparison,
        "threshold": "Critical,Warning",
        "action": rule.action,
        "active": "on",
    }
    assert console.post(_url("healthrule", f"{rule.pk}/change/"), data).status_code == 302
    rule.refresh_from_db()
    assert rule.threshold == "Critical,Warning"
    assert AuditEvent.objects.filter(action="healthrule.updated").exists()


def test_node_list_filters_by_site_rack_and_schedulable(console, operator):
    inside, outside = node(rack=rack("dcx", "rx")), node(rack=rack("dcy", "ry"))
    page = console.get(_url("node"), {"rack__id__exact": inside.rack_id}).content.decode()
    assert inside.name in page and outside.name not in page
    services.node_cordon(node=outside, reason="PSU", actor=operator)
    page = console.get(_url("node"), {"schedulable__exact": "0"}).content.decode()
    assert outside.name in page and inside.name not in page
    assert Rack.objects.count() == 2


@pytest.mark.parametrize(
    ("role", "status"),
    [("developer", 302), ("approver", 302), ("lead", 302), ("outsider", 302), ("operator", 200)],
)
def test_role_matrix_for_blocks_and_the_capacity_tree(client, role, status):
    """Blocks and the topology tree are the operators' (inventory): everyone else is sent to the admin login."""
    people = factories.role_matrix()
    client.force_login(getattr(people, role))
    for url in (_url("block"), _url("block", "add/"), _url("node", "capacity/")):
        assert client.get(url).status_code == status, url
