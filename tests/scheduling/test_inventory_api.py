"""Inventory API: capacity for anyone signed in, nodes and devices for operators; constant queries."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling import services
from scheduling.choices import DeviceHealth
from tests import factories
from tests.scheduling.inventory_helpers import accelerator, active_request, allocate, node, rack

pytestmark = pytest.mark.django_db

CAPACITY, NODES, DEVICES = "/api/v1/inventory/capacity/", "/api/v1/inventory/nodes/", "/api/v1/inventory/devices/"


@pytest.fixture
def cluster():
    """Model A: 2 nodes x 4 devices (one isolated, one unhealthy, one half allocated, one node cordoned);
    model B: 1 node x 2 devices."""
    a, b = accelerator("Alpha 80GB"), accelerator("Beta 24GB", memory_gb=24)
    first, second = node(devices=4, model=a, rack=rack("dc1", "r1")), node(devices=4, model=a)
    third = node(devices=2, model=b)
    devices = list(first.devices.all())
    services.device_isolate(device=devices[0], reason="XID 79")
    services.device_set_health(device=devices[1], health=DeviceHealth.UNHEALTHY, detail="ECC")
    allocate(active_request(), [devices[2]], milli=500)
    services.node_cordon(node=second, reason="PSU", actor=None)
    return a, b, first, second, third


@pytest.mark.parametrize("url", [CAPACITY, NODES, DEVICES])
def test_anonymous_gets_401(api, url):
    response = api.get(url)
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_developer_reads_capacity_but_not_nodes_or_devices(roles, api_as, cluster):
    client = api_as(roles.developer)
    assert client.get(CAPACITY).status_code == 200
    for url in (NODES, DEVICES):
        response = client.get(url)
        assert response.status_code == 403
        body = response.json()
        assert set(body) == {"code", "message", "details"} and body["code"] == "permission_denied"
        assert "Operators only" in body["message"]


def test_staff_without_the_model_permission_is_refused(api_as):
    staff = factories.UserFactory(is_staff=True)
    assert api_as(staff).get(NODES).status_code == 403


def test_operator_reads_everything(roles, api_as, cluster):
    client = api_as(roles.operator)
    for url in (CAPACITY, NODES, DEVICES):
        assert client.get(url).status_code == 200


def test_capacity_by_model_numbers(roles, api_as, cluster):
    a, b, *_ = cluster
    rows = {row["slug"]: row for row in api_as(roles.developer).get(CAPACITY).json()}
    assert rows[a.slug] == {
        "model_id": a.pk,
        "slug": a.slug,
        "name": "Alpha 80GB",
        "vendor": a.vendor.name,
        "memory_gb": 80,
        "total": 8,
        "healthy": 7,
        "isolated": 1,
        "allocated": "0.500",
        # first node: devices 2 (half free) and 3 (free); second node is cordoned
        "free": "1.500",
        "mig_mode_devices": 0,
        "mig_instances": [],
    }
    assert rows[b.slug]["total"] == 2 and rows[b.slug]["free"] == "2.000"


def test_nodes_list_with_capacity_and_filters(roles, api_as, cluster):
    _, _, first, second, third = cluster
    client = api_as(roles.operator)
    body = client.get(NODES).json()
    assert body["count"] == 3
    rows = {row["name"]: row for row in body["results"]}
    assert rows[first.name]["site"] == "dc1" and rows[first.name]["rack"] == "r1"
    assert rows[first.name]["device_count"] == 4
    assert rows[first.name]["allocated_cards"] == 0.5 and rows[first.name]["free_cards"] == 1.5
    assert rows[second.name]["schedulable"] is False and rows[second.name]["free_cards"] == 0
    assert rows[third.name]["cpu_cores"] == 64 and rows[third.name]["memory_gib"] == 256
    assert [row["name"] for row in client.get(NODES, {"schedulable": "false"}).json()["results"]] == [second.name]
    assert [row["name"] for row in client.get(NODES, {"site": "dc1"}).json()["results"]] == [first.name]
    assert client.get(f"{NODES}{first.pk}/").json()["device_count"] == 4


def test_devices_list_and_filters(roles, api_as, cluster):
    _, b, first, *_ = cluster
    client = api_as(roles.operator)
    assert client.get(DEVICES).json()["count"] == 10
    isolated = client.get(DEVICES, {"isolated": "true"}).json()["results"]
    assert [(row["node"], row["index"], row["isolation_reason"]) for row in isolated] == [(first.name, 0, "XID 79")]
    assert client.get(DEVICES, {"model": b.slug}).json()["count"] == 2
    assert client.get(DEVICES, {"health": "unhealthy"}).json()["count"] == 1
    assert client.get(DEVICES, {"node": first.name}).json()["results"][2]["allocated_milli"] == 500


@pytest.mark.parametrize("url", [CAPACITY, NODES, DEVICES])
def test_query_count_does_not_grow_with_inventory(roles, api_as, url):
    client = api_as(roles.operator)
    model = accelerator()
    node(devices=2, model=model, rack=rack())
    client.get(url)  # warm caches (content types, permissions)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    for _ in range(6):
        node(devices=4, model=accelerator(), rack=rack())
    with CaptureQueriesContext(connection) as many:
        assert client.get(url).status_code == 200
    assert len(many) == len(few) <= 8


def test_capacity_cards_are_decimal_strings(roles, api_as):
    node(devices=1)
    [row] = api_as(roles.developer).get(CAPACITY).json()
    assert Decimal(row["free"]) == 1
