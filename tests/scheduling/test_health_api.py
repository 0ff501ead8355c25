"""POST /api/v1/health/events/: who may send, structured events and dcgm-exporter text in, outcomes out."""

from types import SimpleNamespace

import pytest

from requests import services as request_services
from requests.choices import EventCode, RequestState
from scheduling import cycle
from scheduling.choices import DeviceHealth
from scheduling.models import Device, HealthEvent
from tenancy.models import AuditEvent
from tests import factories
from tests.requests.conftest import GENEROUS_QUOTA, make_order
from tests.scheduling.health_inventory import DCGM_TEXT, HOSTNAME, UUIDS, device, gpu_node, ingest_user

URL = "/api/v1/health/events/"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
XID_79 = {"device_uuid": UUIDS[1], "source": "dcgm", "signal": "DCGM_FI_DEV_XID_ERRORS", "value": 79}

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    return gpu_node()


@pytest.fixture
def agent(api_as):
    return api_as(ingest_user(username="dcgm-exporter"))


def send_text(client, text):
    return client.generic("POST", URL, text.encode(), content_type=PROMETHEUS)


def device_states():
    return list(Device.objects.order_by("uuid").values_list("uuid", "health", "isolated"))


# --- who may send ------------------------------------------------------------------------------------------


def test_anonymous_is_401(api, node):
    response = api.post(URL, {"events": [XID_79]}, format="json")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert not device(UUIDS[1]).isolated


@pytest.mark.parametrize("who", ["developer", "operator"])
def test_developers_and_operators_without_the_ingest_permission_are_403(api_as, roles, node, who):
    response = api_as(getattr(roles, who)).post(URL, {"events": [XID_79]}, format="json")
    assert response.status_code == 403
    body = response.json()
    assert body["code"] == "permission_denied" and "ingest_health" in body["message"]
    assert set(body) == {"code", "message", "details"}
    assert not device(UUIDS[1]).isolated and not HealthEvent.objects.exists()


def test_a_session_login_is_not_enough(client, node):
    user = ingest_user()
    client.force_login(user)
    assert client.post(URL, {"events": [XID_79]}, content_type="application/json").status_code == 401


def test_an_ingest_token_is_200(agent, node):
    response = agent.post(URL, {"events": [XID_79]}, format="json")
    assert response.status_code == 200, response.json()
    assert device(UUIDS[1]).isolated


# --- structured events -------------------------------------------------------------------------------------


def test_xid_79_isolates_and_the_response_says_so(agent, node):
    body = agent.post(URL, {"events": [XID_79]}, format="json").json()
    assert (body["received"], body["matched"], body["unknown_devices"]) == (1, 1, [])
    (event,) = body["events"]
    assert event == {
        "source": "dcgm",
        "signal": "DCGM_FI_DEV_XID_ERRORS",
        "value": 79,
        "target": {"device_uuid": UUIDS[1]},
        "outcome": "matched",
        "devices": [UUIDS[1]],
        "rule": "Fatal XID (48, 63, 64, 79) isolates",
        "action": "isolate",
    }
    assert body["devices"] == [
        {
            "uuid": UUIDS[1],
            "node": HOSTNAME,
            "index": 1,
            "action": "isolate",
            "changed": True,
            "health": "healthy",
            "isolated": True,
        }
    ]
    audit = AuditEvent.objects.get(action="device.isolated")
    assert audit.actor.username == "dcgm-exporter"


def test_bmc_states_for_a_node_and_for_one_device(agent, node):
    events = [
        {"node": HOSTNAME, "source": "bmc", "signal": "Status.Health", "value": "Warning"},
        {"node": HOSTNAME, "index": 3, "source": "bmc", "signal": "Status.Health", "value": "Critical"},
    ]
    body = agent.post(URL, {"events": events}, format="json").json()
    assert [e["devices"] for e in body["events"]] == [UUIDS, [UUIDS[3]]]
    assert [(d["index"], d["action"]) for d in body["devices"]] == [
        (0, "degrade"),
        (1, "degrade"),
        (2, "degrade"),
        (3, "isolate"),
    ]
    assert [(h, i) for _, h, i in sorted(device_states(), key=lambda row: UUIDS.index(row[0]))] == [
        ("degraded", False),
        ("degraded", False),
        ("degraded", False),
        ("healthy", True),
    ]


def test_unknown_devices_come_back_in_the_response(agent, node):
    events = [
        {
            "device_uuid": "GPU-00000000-dead-beef-0000-000000000000",
            "source": "dcgm",
            "signal": "DCGM_FI_DEV_XID_ERRORS",
            "value": 79,
        },
        {"node": "rack9-node4", "source": "bmc", "signal": "Status.Health", "value": "Critical"},
        {"node": HOSTNAME, "index": 0, "source": "agent", "signal": "heartbeat", "value": "ok"},
    ]
    response = agent.post(URL, {"events": events}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["unknown_devices"] == [
        {"device_uuid": "GPU-00000000-dead-beef-0000-000000000000"},
        {"node": "rack9-node4"},
    ]
    assert [e["outcome"] for e in body["events"]] == ["unknown_device", "unknown_device", "no_rule"]
    assert body["devices"] == [] and not HealthEvent.objects.exists()


# --- dcgm-exporter text ------------------------------------------------------------------------------------


def test_a_dcgm_exporter_scrape(agent, node):
    response = send_text(agent, DCGM_TEXT)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["received"], body["matched"]) == (100, 3)
    assert {d["uuid"]: (d["action"], d["health"], d["isolated"]) for d in body["devices"]} == {
        UUIDS[1]: ("isolate", "healthy", True),  # XID 79
        UUIDS[2]: ("degrade", "degraded", False),  # 91 C
        UUIDS[3]: ("isolate", "healthy", True),  # 2 double-bit ECC errors
    }
    assert device(UUIDS[0]).health == DeviceHealth.HEALTHY
    assert set(HealthEvent.objects.values_list("signal", "value")) == {
        ("DCGM_FI_DEV_XID_ERRORS", "79"),
        ("DCGM_FI_DEV_GPU_TEMP", "91"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2"),
    }


def test_a_scrape_naming_a_gpu_not_in_inventory_reports_it(agent):
    gpu_node(uuids=UUIDS[:3])
    body = send_text(agent, DCGM_TEXT).json()
    assert body["unknown_devices"] == [{"device_uuid": UUIDS[3], "node": HOSTNAME, "index": 3}]
    assert sum(e["outcome"] == "unknown_device" for e in body["events"]) == 25


def test_repeated_scrapes_change_nothing_more_in_a_constant_number_of_queries(
    agent, node, django_assert_max_num_queries
):
    send_text(agent, DCGM_TEXT)
    states, audits = device_states(), AuditEvent.objects.count()
    with django_assert_max_num_queries(12):
        body = send_text(agent, DCGM_TEXT).json()
    assert device_states() == states and AuditEvent.objects.count() == audits
    assert not any(d["changed"] for d in body["devices"])


def test_an_xid_on_a_running_card_reaches_its_request_and_the_next_cycle_avoids_isolated_cards(
    agent, django_capture_on_commit_callbacks, settings
):
    """End to end: a 2-card request runs on the node, a fatal XID arrives for one of its cards and for a free one;
    the running request hears of it on its timeline, and the cycle that health_changed triggers keeps the next
    2-card request waiting instead of placing it on the isolated card. (Requeueing the running request is a
    policy, off here; tests/scheduling/test_cycle.py covers it.)"""
    settings.SCHEDULER_REQUEUE_ON_ISOLATION = False
    accelerator = factories.AcceleratorModelFactory(memory_gb=80)
    spec = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=2, cpu_cores=8, memory_gb=64
    )
    image = factories.ImageFactory()
    shop = SimpleNamespace(service=factories.ServiceFactory(specs=[spec], images=[image]), image=image)
    project = factories.project(quota=GENEROUS_QUOTA)
    developer = factories.member(project)
    gpu_node(model=accelerator)

    running = request_services.request_submit(order=make_order(shop, project, spec=spec), requester=developer)
    cycle.run_cycle()
    running.refresh_from_db()
    assert running.state == RequestState.ALLOCATED
    bound = sorted(running.allocations.get().devices.values_list("device__uuid", flat=True))
    free = sorted(set(UUIDS) - set(bound))
    waiting = request_services.request_submit(order=make_order(shop, project, spec=spec), requester=developer)
    assert waiting.state == RequestState.QUEUED  # submitted outside on_commit capture: no cycle ran yet

    xids = [{**XID_79, "device_uuid": bound[0]}, {**XID_79, "device_uuid": free[0]}]
    with django_capture_on_commit_callbacks(execute=True):
        assert agent.post(URL, {"events": xids}, format="json").status_code == 200

    note = running.events.get(code=EventCode.DEVICE_ISOLATED)
    assert note.data["device"] == bound[0] and note.actor.username == "dcgm-exporter"
    running.refresh_from_db()
    assert running.state == RequestState.ALLOCATED  # with requeue off, isolation stops new placements only
    waiting.refresh_from_db()
    assert waiting.state == RequestState.QUEUED
    # the triggered cycle ran: of the two free cards only one is healthy, so the pair no longer fits
    assert waiting.queue_reason["code"] == "capacity_in_use"
    assert waiting.queue_reason["numbers"]["free_milli"] == 1000
    assert not Device.objects.filter(uuid=free[0], bindings__allocation__request=waiting).exists()


# --- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        'DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-8b2e7f40-1c5d-4e6a-b3f2-0d9c7a1e4b22" 79',
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n",
        "",
    ],
)
def test_unparseable_text_is_400_and_changes_nothing(agent, node, text):
    before = device_states()
    response = send_text(agent, DCGM_TEXT + text) if text.startswith("DCGM") else send_text(agent, text)
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert (
        device_states() == before
        and not HealthEvent.objects.exists()
        and not AuditEvent.objects.filter(action="device.isolated").exists()
    )


@pytest.mark.parametrize(
    "payload",
    [
        [XID_79],
        {"events": XID_79},
        {"events": []},
        {"event": [XID_79]},
        {"events": [{**XID_79, "source": "snmp"}]},
        {"events": [{**XID_79, "value": {"xid": 79}}]},
        {"events": [{**XID_79, "value": None}]},
        {"events": [{k: v for k, v in XID_79.items() if k != "signal"}]},
        {"events": [{"source": "bmc", "signal": "Status.Health", "value": "Critical"}]},
        {"events": [{"index": 1, "source": "bmc", "signal": "Status.Health", "value": "Critical"}]},
        {"events": [{**XID_79, "node": HOSTNAME, "index": 1}]},
        {"events": [{"node": HOSTNAME, "index": -1, "source": "dcgm", "signal": "X", "value": 1}]},
        {"events": [XID_79, {**XID_79, "source": "nope"}]},  # one bad event refuses the whole batch
    ],
)
def test_wrong_json_shape_is_400_and_changes_nothing(agent, node, payload):
    response = agent.post(URL, payload, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "validation_error" and body["message"]
    assert not device(UUIDS[1]).isolated and not HealthEvent.objects.exists()


def test_malformed_json_is_400(agent, node):
    response = agent.generic("POST", URL, b'{"events": [', content_type="application/json")
    assert response.status_code == 400
    assert set(response.json()) == {"code", "message", "details"}
    assert not HealthEvent.objects.exists()


# --- numbers that cannot be used ---------------------------------------------------------------------------

HOT_GPU2 = f'DCGM_FI_DEV_GPU_TEMP{{gpu="2",UUID="{UUIDS[2]}",Hostname="{HOSTNAME}"}} '


def assert_nothing_applied():
    assert not HealthEvent.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="device.").exists()
    assert set(Device.objects.values_list("health", "isolated")) == {(DeviceHealth.HEALTHY, False)}


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e308", "1e400", "18446744073709551617"])
def test_a_scrape_with_an_unusable_number_is_400_and_applies_nothing_of_it(agent, node, value):
    """Before the fix +Inf degraded the card, then the response could not be rendered (500, half applied)."""
    # the recorded scrape isolates gpu1 and gpu3 and degrades gpu2; one bad line must stop all of it
    response = send_text(agent, DCGM_TEXT + HOT_GPU2 + value + "\n")
    assert response.status_code == 400, response.content
    body = response.json()
    assert set(body) == {"code", "message", "details"} and body["code"] == "invalid_telemetry"
    [problem] = body["details"]["samples"]
    assert problem["signal"] == "DCGM_FI_DEV_GPU_TEMP" and problem["target"]["device_uuid"] == UUIDS[2]
    assert_nothing_applied()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-inf", "1e400", 1e308, -1e300, 10**40])
def test_structured_events_with_an_unusable_number_are_400_and_apply_nothing(agent, node, value):
    hot = {"device_uuid": UUIDS[2], "source": "dcgm", "signal": "DCGM_FI_DEV_GPU_TEMP", "value": value}
    response = agent.post(URL, {"events": [XID_79, hot]}, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_telemetry" and body["details"]["samples"][0]["position"] == 1
    assert_nothing_applied()


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"NaN", b"Infinity"])
def test_json_numbers_beyond_floats_are_4xx_and_apply_nothing(agent, node, number):
    """1e400 parses to an infinite float; NaN and Infinity are not JSON at all."""
    event = b'{"device_uuid": "%s", "source": "dcgm", "signal": "DCGM_FI_DEV_GPU_TEMP", "value": %s}' % (
        UUIDS[2].encode(),
        number,
    )
    response = agent.generic("POST", URL, b'{"events": [%s]}' % event, content_type="application/json")
    assert response.status_code == 400, response.content
    assert set(response.json()) == {"code", "message", "details"}
    assert_nothing_applied()


def test_the_largest_counter_value_is_still_a_number(agent, node):
    ecc = {"device_uuid": UUIDS[3], "source": "dcgm", "signal": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "value": 2**64}
    response = agent.post(URL, {"events": [ecc]}, format="json")
    assert response.status_code == 200, response.content
    assert device(UUIDS[3]).isolated
