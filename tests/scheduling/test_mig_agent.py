"""POST /api/v1/health/mig-layout/: node agents report their cards' MIG mode and GPU instances. Role matrix,
per-card refusals (another node's card, an impossible layout, an unknown card) that change nothing, and constant
queries per card."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import MigGeometry
from scheduling.models import MigInstance
from tests.scheduling.agent_tokens import agent_api
from tests.scheduling.health_inventory import ingest_user
from tests.scheduling.inventory_helpers import accelerator, node

pytestmark = pytest.mark.django_db

URL = "/api/v1/health/mig-layout/"


@pytest.fixture
def hosts(db):
    model = accelerator()
    model.mig_geometry = MigGeometry.objects.get(name="A100 40GB")
    model.save()
    return node(devices=2, model=model, name="mine"), node(devices=1, model=model, name="theirs")


def report(device, instances, mig_mode=True):
    return {"uuid": device.uuid, "mig_mode": mig_mode, "instances": instances}


LAYOUT = [
    {"profile": "3g.20gb", "start": 4, "size": 4, "gi_id": 1, "ci_id": 0, "uuid": "MIG-11111111"},
    {"profile": "2g.10gb", "start": 0, "size": 2, "gi_id": 3, "ci_id": 0, "uuid": "MIG-22222222"},
]


def test_role_matrix(api, api_as, roles, hosts):
    mine, _ = hosts
    body = {"devices": [report(mine.devices.first(), LAYOUT)]}
    assert api.post(URL, body, format="json").status_code == 401
    for user in (roles.developer, roles.other_developer, roles.approver, roles.lead, roles.operator):
        response = api_as(user).post(URL, body, format="json")
        assert response.status_code == 403, user
        assert response.json()["code"] == "permission_denied"
    assert not MigInstance.objects.exists()
    response = api_as(ingest_user()).post(URL, body, format="json")  # a central exporter: any node
    assert response.status_code == 200 and response.json()["stored"] == [mine.devices.first().uuid]


def test_an_agent_reports_its_nodes_cards_only(hosts):
    mine, theirs = hosts
    first, second = mine.devices.order_by("index")
    other = theirs.devices.get()
    bad = [{"profile": "3g.20gb", "start": 0}, {"profile": "2g.10gb", "start": 2}]  # overlap at 2-3
    response = agent_api(nodes=[mine]).post(
        URL,
        {
            "devices": [
                report(first, LAYOUT),
                report(second, bad),
                report(other, LAYOUT),
                {"uuid": "GPU-nobody", "mig_mode": False},
            ]
        },
        format="json",
    )
    assert response.status_code == 200
    body = response.json()
    assert body["stored"] == [first.uuid]
    assert [r["code"] for r in body["refused"]] == ["invalid_mig_layout", "not_your_node", "unknown_device"]
    assert "overlaps memory slices 2–3" in body["refused"][0]["message"]  # noqa: RUF001
    assert sorted(MigInstance.objects.values_list("device_id", "profile__name", "start", "uuid")) == [
        (first.pk, "2g.10gb", 0, "MIG-22222222"),
        (first.pk, "3g.20gb", 4, "MIG-11111111"),
    ]


def layout(device):
    return [{**instance, "uuid": f"{instance['uuid']}-{device.index}"} for instance in LAYOUT]


def test_a_mig_uuid_is_one_instances(hosts):
    mine, _ = hosts
    first, second = mine.devices.order_by("index")
    response = agent_api(nodes=[mine]).post(
        URL, {"devices": [report(first, LAYOUT), report(second, LAYOUT)]}, format="json"
    )
    assert response.status_code == 200
    assert [r["code"] for r in response.json()["refused"]] == ["mig_uuid_in_use"]
    assert set(MigInstance.objects.values_list("device_id", flat=True)) == {first.pk}


def test_each_card_costs_a_fixed_number_of_queries(hosts):
    mine, _ = hosts
    client = agent_api(nodes=[mine])
    first, second = mine.devices.order_by("index")

    def count(devices):
        with CaptureQueriesContext(connection) as queries:
            response = client.post(URL, {"devices": [report(d, layout(d)) for d in devices]}, format="json")
        assert response.status_code == 200 and not response.json()["refused"]
        return len(queries)

    count([first, second])  # both cards have the layout now: the next reports change nothing
    one, two = count([first]), count([first, second])
    assert two - one <= one
