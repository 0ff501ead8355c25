"""Idle detection end to end: an offering's idle policy, readings fed through the agent API (dcgm lines and runtime
reports with sessions), the sweep that warns by mail and on the page, the owner's snooze (bounded, with a reason, on
the timeline), the stop through the release service, busy again clearing the warning, bare metal warned but never
stopped, the role matrix of the snooze page and endpoint, and a sweep whose queries do not grow with the requests."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from metering.idle import services as idle_services
from metering.idle.selectors import watched_requests
from metering.models import IdlePolicy, IdleWatch, TelemetrySample, TokenUsage
from requests.choices import EventCode, RequestState
from scheduling.models import AllocationDevice
from serving.usage import Tally, tokens_flush
from tenancy.models import AuditEvent
from tests import factories
from tests.provisioning.conftest import add_node, bare_metal, compute, run_on_commit, shop, team  # noqa: F401
from tests.scheduling.agent_tokens import agent_api
from tests.smtp_server import text_of

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
EVENTS, RUNTIME = "/api/v1/health/events/", "/api/v1/health/runtime/"
IDLE_CODES = [EventCode.IDLE_WARNING, EventCode.IDLE_SNOOZED, EventCode.IDLE_CLEARED, EventCode.IDLE_STOPPED]


def policy_for(service, **overrides) -> IdlePolicy:
    terms = {"idle_minutes": 120, "warning_minutes": 30, "max_snoozes": 1, "snooze_minutes": 60, **overrides}
    return IdlePolicy.objects.create(service=service, **terms)


def dcgm_lines(request, utilization: float) -> str:
    """What an agent's dcgm-exporter prints for the request's cards."""
    lines = []
    for binding in AllocationDevice.objects.filter(allocation__request=request).select_related("device__node"):
        device = binding.device
        labels = f'gpu="{device.index}",UUID="{device.uuid}",Hostname="{device.node.name}"'
        for metric, value in (("GPU_UTIL", utilization), ("FB_USED", 2048), ("POWER_USAGE", 80)):
            lines.append(f"DCGM_FI_DEV_{metric}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


class Agent:
    """The node agent: pushes card readings and runtime reports through the agent API, as a real one does."""

    def __init__(self, node, run_on_commit):  # noqa: F811
        self.client, self.run_on_commit = agent_api([node]), run_on_commit

    def reads(self, request, *, utilization: float, sessions: int = 0):
        def post():
            body = dcgm_lines(request, utilization)
            events = self.client.post(EVENTS, body, content_type="text/plain; version=0.0.4")
            assert events.status_code == 200, events.content
            report = {"request": request.pk, "status": "running", "sessions": sessions}
            runtime = self.client.post(RUNTIME, {"reports": [report]}, format="json")
            assert runtime.json()["results"] == {str(request.pk): "heartbeat"}

        self.run_on_commit(post)


def sweep(run_on_commit):  # noqa: F811
    return run_on_commit(idle_services.idle_sweep).as_dict()


def timeline(request) -> list[tuple[str, str]]:
    return list(request.events.filter(code__in=IDLE_CODES).order_by("pk").values_list("code", "message"))


def quiet_until(traveller, agent, request, minute: int, *, start: int = 0):
    """Idle readings every ten minutes from `start` to `minute` after T0, the clock moved along."""
    for at in range(start, minute + 1, 10):
        traveller.move_to(T0 + timedelta(minutes=at))
        agent.reads(request, utilization=0.0)
    traveller.move_to(T0 + timedelta(minutes=minute))


@pytest.fixture
def idle_shop(compute, run_on_commit):  # noqa: F811
    policy_for(compute.shop.service)
    return compute, Agent(compute.node, run_on_commit)


def test_an_idle_workspace_is_warned_snoozed_once_then_stopped_on_schedule(idle_shop, run_on_commit, mailbox, client):  # noqa: F811
    world, agent = idle_shop
    with time_machine.travel(T0, tick=False) as traveller:
        request = world.order()
        assert request.state == RequestState.ACTIVE
        quiet_until(traveller, agent, request, 80)
        assert TelemetrySample.objects.filter(allocation__request=request).count() == 9 * 2  # the agent's, per card
        assert sweep(run_on_commit)["warned"] == []

        quiet_until(traveller, agent, request, 90, start=90)
        assert sweep(run_on_commit)["warned"] == [request.pk]
        assert sweep(run_on_commit)["warned"] == []  # once
        [(code, message)] = timeline(request)
        assert code == EventCode.IDLE_WARNING
        assert message.startswith("Idle for 1 h 30 min: Accelerator utilisation below 5%. No SSH or Jupyter")
        assert "Stops at 2026-12-07 11:00 UTC" in message
        warning = request.events.get(code=EventCode.IDLE_WARNING)
        assert [reason["code"] for reason in warning.data["reasons"]] == ["accelerators_idle", "no_sessions"]
        assert warning.data["reasons"][0]["details"]["last_utilization_pct"] == 0.0

        mails = mailbox.wait_for(2)  # ready, then the warning
        assert mails[1]["Subject"] == f"Request #{request.pk} is idle and will be stopped"
        assert "Stops at 2026-12-07 11:00 UTC" in text_of(mails[1])

        client.force_login(world.team.developer)
        page = client.get(f"/requests/{request.pk}/").content.decode()
        assert "Idle for 1 h 30 min — stops at 11:00 UTC" in page and 'id="idle-snooze"' in page

        developer = APIClient()
        developer.force_authenticate(world.team.developer)
        refused = developer.post(f"/api/v1/requests/{request.pk}/idle/snooze/", {"reason": " "}, format="json")
        assert refused.status_code == 400 and refused.json()["code"] == "validation_error"
        snoozed = developer.post(
            f"/api/v1/requests/{request.pk}/idle/snooze/", {"reason": "a long eval starts at noon"}, format="json"
        )
        assert snoozed.status_code == 200, snoozed.json()
        assert snoozed.json()["snoozes"] == 1 and snoozed.json()["snoozed_until"] == "2026-12-07T12:00:00Z"
        again = developer.post(f"/api/v1/requests/{request.pk}/idle/snooze/", {"reason": "more"}, format="json")
        assert again.status_code == 409 and again.json()["code"] == "not_warned"

        quiet_until(traveller, agent, request, 149, start=100)
        assert sweep(run_on_commit) == {"warned": [], "cleared": [], "acted": [], "busy": []}
        quiet_until(traveller, agent, request, 150, start=150)
        assert sweep(run_on_commit)["warned"] == [request.pk]  # warned again the lead before the snooze ends
        exhausted = developer.post(f"/api/v1/requests/{request.pk}/idle/snooze/", {"reason": "x"}, format="json")
        assert exhausted.status_code == 409 and exhausted.json()["code"] == "snoozes_exhausted"
        assert exhausted.json()["details"] == {"max_snoozes": 1, "snoozes": 1}

        quiet_until(traveller, agent, request, 179, start=160)
        assert sweep(run_on_commit)["acted"] == []
        quiet_until(traveller, agent, request, 180, start=180)
        assert sweep(run_on_commit)["acted"] == [request.pk]

    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    codes = [code for code, _ in timeline(request)]
    assert codes == [EventCode.IDLE_WARNING, EventCode.IDLE_SNOOZED, EventCode.IDLE_WARNING, EventCode.IDLE_STOPPED]
    snooze = request.events.get(code=EventCode.IDLE_SNOOZED)
    assert snooze.actor == world.team.developer and "a long eval starts at noon" in snooze.message
    stopped = request.events.get(code=EventCode.IDLE_STOPPED)
    assert stopped.message.startswith("Stopped and released: idle for 3 h (Accelerator utilisation below 5%.")
    assert stopped.data["reasons"][0]["details"]["threshold_pct"] == 5
    assert request.events.filter(code=EventCode.RELEASING, message__contains="idle for 3 h after a warning").exists()
    subjects = [mail["Subject"] for mail in mailbox.wait_for(5)]
    assert subjects == [
        f"Request #{request.pk} is ready: how to connect",
        f"Request #{request.pk} is idle and will be stopped",
        f"Request #{request.pk} is idle and will be stopped",
        f"Request #{request.pk} was stopped for being idle",
        f"Request #{request.pk} released",
    ]
    # Three hours idle on two cards, counted when the episode ended.
    assert IdleWatch.objects.get(request=request).idle_card_seconds == pytest.approx(3 * 3600 * 2)


def test_busy_again_clears_the_warning_and_nothing_is_stopped(idle_shop, run_on_commit):  # noqa: F811
    world, agent = idle_shop
    with time_machine.travel(T0, tick=False) as traveller:
        request = world.order()
        quiet_until(traveller, agent, request, 90)
        assert sweep(run_on_commit)["warned"] == [request.pk]
        traveller.move_to(T0 + timedelta(minutes=100))
        agent.reads(request, utilization=63.0)  # a training step
        assert sweep(run_on_commit)["cleared"] == [request.pk]
        quiet_until(traveller, agent, request, 180, start=110)
        assert sweep(run_on_commit) == {"warned": [], "cleared": [], "acted": [], "busy": []}
        # An open SSH session is use too: a new episode starts from it.
        traveller.move_to(T0 + timedelta(minutes=185))
        agent.reads(request, utilization=0.0, sessions=1)
        quiet_until(traveller, agent, request, 270, start=190)
        assert sweep(run_on_commit)["warned"] == []
        # The usage API: 4.5 h held on two cards, of which the cleared episode's 100 minutes idle.
        developer = APIClient()
        developer.force_authenticate(world.team.developer)
        body = developer.get("/api/v1/usage/idle/").json()
        [line] = body["requests"]
        assert line == {
            "request": request.pk,
            "project": world.team.project.slug,
            "card_hours": 9.0,
            "idle_card_hours": 3.3333,
            "used_card_hours": 5.6667,
        }
        assert body["projects"] == [{key: value for key, value in line.items() if key != "request"}]
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    assert [code for code, _ in timeline(request)] == [EventCode.IDLE_WARNING, EventCode.IDLE_CLEARED]
    watch = IdleWatch.objects.get(request=request)
    assert watch.warned_at is None and watch.idle_card_seconds == pytest.approx(100 * 60 * 2)


def test_an_agent_s_readings_count_only_for_its_own_nodes(idle_shop, run_on_commit):  # noqa: F811
    world, _ = idle_shop
    request = world.order()
    stranger = agent_api([add_node(world.shop.accelerator, name="elsewhere")])
    body = dcgm_lines(request, 0.0)
    run_on_commit(stranger.post, EVENTS, body, content_type="text/plain; version=0.0.4")
    assert not TelemetrySample.objects.exists()
    refused = stranger.post(
        RUNTIME, {"reports": [{"request": request.pk, "status": "running", "sessions": 2}]}, format="json"
    )
    assert refused.json()["results"] == {str(request.pk): "not_your_node"}
    assert request.allocations.get().session_seen_at is None


def test_gateway_calls_are_read_from_the_token_ledger_s_last_flush(idle_shop):
    world, _ = idle_shop
    request = world.order()
    with time_machine.travel(T0 + timedelta(minutes=42), tick=False):
        tally = Tally(request.pk, request.project_id, "m", "k1", T0.date(), 3, 10, 20)
        assert tokens_flush([tally]) == 1
    with time_machine.travel(T0 + timedelta(minutes=50), tick=False):
        tokens_flush([Tally(request.pk, request.project_id, "m", "k1", T0.date(), 1, 1, 1)])
    row = TokenUsage.objects.get(request=request)
    assert (row.requests, row.last_call_at) == (4, T0 + timedelta(minutes=50))
    [watched] = watched_requests()
    assert watched.activity.last_call_at == T0 + timedelta(minutes=50)


def test_without_readings_nothing_is_judged_idle(idle_shop, run_on_commit):  # noqa: F811
    world, _ = idle_shop
    with time_machine.travel(T0, tick=False) as traveller:
        request = world.order()
        traveller.move_to(T0 + timedelta(hours=5))
        assert sweep(run_on_commit)["warned"] == []
    assert timeline(request) == []


def test_bare_metal_leases_are_warned_never_stopped(bare_metal, run_on_commit, mailbox):  # noqa: F811
    policy_for(bare_metal.service)
    agent = Agent(bare_metal.node, run_on_commit)
    with time_machine.travel(T0, tick=False) as traveller:
        request = bare_metal.order()
        assert request.state == RequestState.ACTIVE
        quiet_until(traveller, agent, request, 90)
        assert sweep(run_on_commit)["warned"] == [request.pk]
        quiet_until(traveller, agent, request, 600, start=100)
        assert sweep(run_on_commit) == {"warned": [], "cleared": [], "acted": [], "busy": []}
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    [(code, message)] = timeline(request)
    assert code == EventCode.IDLE_WARNING and "Bare-metal leases are not stopped" in message
    assert IdleWatch.objects.get(request=request).acts_at is None
    assert mailbox.subjects()[-1] == f"Request #{request.pk} is idle and will be stopped"


# --- the role matrix of the snooze page and endpoint ------------------------------------------------------------


@pytest.fixture
def warned(idle_shop, run_on_commit):  # noqa: F811
    world, agent = idle_shop
    with time_machine.travel(T0, tick=False) as traveller:
        request = world.order()
        quiet_until(traveller, agent, request, 90)
        assert sweep(run_on_commit)["warned"] == [request.pk]
    crew = world.team
    people = {
        "developer": crew.developer,
        "other_tenant_developer": factories.member(factories.project()),
        "viewer": factories.member(crew.project),
        "approver": crew.approver,
        "lead": crew.project.lead,
        "operator": crew.operator,
    }
    return request, people


MATRIX = {  # who: (API status, page status)
    "anonymous": (401, 302),
    "other_tenant_developer": (404, 404),
    "viewer": (403, 403),
    "approver": (403, 403),
    "lead": (200, 200),
    "operator": (200, 200),
    "developer": (200, 200),
}


@pytest.mark.parametrize("who", list(MATRIX))
def test_role_matrix_of_the_snooze(warned, who, client):
    request, people = warned
    api_status, page_status = MATRIX[who]
    api = APIClient()
    if who != "anonymous":
        api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token_for(people[who])}")
        client.force_login(people[who])
    url = f"/api/v1/requests/{request.pk}/idle/snooze/"
    response = api.post(url, {"reason": "still needed"}, format="json")
    assert response.status_code == api_status, response.content
    assert set(response.json()) >= ({"warned", "snoozes"} if api_status == 200 else {"code", "message", "details"})
    assert client.get(f"/requests/{request.pk}/idle/snooze/").status_code == page_status
    snoozes = IdleWatch.objects.get(request=request).snoozes
    assert snoozes == (1 if api_status == 200 else 0)
    if api_status == 200:
        event = request.events.get(code=EventCode.IDLE_SNOOZED)
        assert event.actor == people[who] and "still needed" in event.message
        status = api.get(f"/api/v1/requests/{request.pk}/idle/").json()
        assert status["snoozes"] == 1 and status["snoozes_left"] == 0


def test_the_snooze_page_posts_with_a_reason_and_says_so_on_the_request_page(warned, client):
    request, people = warned
    client.force_login(people["developer"])
    asked = client.get(f"/requests/{request.pk}/idle/snooze/")
    assert asked.status_code == 200 and b"Keep request" in asked.content
    assert client.post(f"/requests/{request.pk}/idle/snooze/", {"reason": ""}).status_code == 400
    done = client.post(f"/requests/{request.pk}/idle/snooze/", {"reason": "demo on Monday"}, follow=True)
    page = done.content.decode()
    assert "idle stop snoozed" in page and "Idle stop snoozed until" in page
    assert request.events.filter(code=EventCode.IDLE_SNOOZED, message__contains="demo on Monday").exists()


def test_a_viewer_sees_the_banner_without_the_snooze_button(warned, client):
    request, people = warned
    client.force_login(people["viewer"])
    page = client.get(f"/requests/{request.pk}/").content.decode()
    assert 'id="idle-banner"' in page and 'id="idle-snooze"' not in page


# --- the sweep's cost -------------------------------------------------------------------------------------------


def test_the_sweep_reads_in_a_fixed_number_of_queries_however_many_requests(idle_shop, run_on_commit):  # noqa: F811
    world, _ = idle_shop
    for index in range(3):
        add_node(world.shop.accelerator, name=f"x{index}")

    def counted(requests) -> int:
        for request in requests:
            agent_for = Agent(request.allocations.get().node, run_on_commit)
            agent_for.reads(request, utilization=0.0)
        with CaptureQueriesContext(connection) as queries:
            assert idle_services.idle_sweep().as_dict()["warned"] == []
        return len(queries)

    with time_machine.travel(T0, tick=False):
        few = [world.order() for _ in range(2)]
        fewer_count = counted(few)
        many = few + [world.order() for _ in range(6)]
        assert all(request.state == RequestState.ACTIVE for request in many)
        assert counted(many) == fewer_count == 1


# --- the operators' console -------------------------------------------------------------------------------------


def test_operators_set_an_idle_policy_per_offering_in_the_console_audited(console, operator, shop):  # noqa: F811
    form = {
        "service": shop.service.pk,
        "active": "on",
        "action": "release",
        "watch_utilization": "on",
        "utilization_below_pct": "5",
        "watch_sessions": "on",
        "idle_minutes": "120",
        "warning_minutes": "120",
        "max_snoozes": "2",
        "snooze_minutes": "60",
    }
    refused = console.post("/admin/metering/idlepolicy/add/", form)
    assert refused.status_code == 200 and "The warning must come before the idle time" in refused.content.decode()
    none_watched = {key: value for key, value in form.items() if not key.startswith("watch_")}
    refused = console.post("/admin/metering/idlepolicy/add/", {**none_watched, "warning_minutes": "30"})
    assert refused.status_code == 200 and "Watch at least one signal" in refused.content.decode()
    assert not IdlePolicy.objects.exists()

    assert console.post("/admin/metering/idlepolicy/add/", {**form, "warning_minutes": "30"}).status_code == 302
    policy = IdlePolicy.objects.get(service=shop.service)
    assert (policy.idle_minutes, policy.warning_minutes, policy.watch_gateway) == (120, 30, False)
    created = AuditEvent.objects.get(action="idlepolicy.created")
    assert created.actor == operator
    changelist = console.get("/admin/metering/idlepolicy/")
    assert "utilisation &lt; 5%, no sessions" in changelist.content.decode()


def test_the_idle_consoles_changelists_cost_a_fixed_number_of_queries(console, shop, django_assert_max_num_queries):  # noqa: F811
    for index in range(5):
        service = factories.ServiceFactory(specs=[shop.whole], images=[shop.image], name=f"Offering {index}")
        policy_for(service)
    with django_assert_max_num_queries(12):
        assert console.get("/admin/metering/idlepolicy/").status_code == 200
    with django_assert_max_num_queries(12):
        assert console.get("/admin/metering/idlewatch/").status_code == 200


def test_a_policy_turned_off_stops_nothing_and_shows_nothing(warned, client, run_on_commit):  # noqa: F811
    request, people = warned
    IdlePolicy.objects.filter(service=request.service).update(active=False)
    with time_machine.travel(T0 + timedelta(hours=6), tick=False):
        assert sweep(run_on_commit) == {"warned": [], "cleared": [], "acted": [], "busy": []}
    client.force_login(people["developer"])
    assert 'id="idle-banner"' not in client.get(f"/requests/{request.pk}/").content.decode()
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE


def test_only_a_serving_offering_scales_to_zero_and_only_with_its_calls_watched(shop):  # noqa: F811
    from django.core.exceptions import ValidationError

    from catalog.choices import ServiceKind
    from metering.choices import IdleAction

    workspace = IdlePolicy(service=shop.service, action=IdleAction.SCALE_TO_ZERO)
    with pytest.raises(ValidationError) as refused:
        workspace.full_clean()
    assert refused.value.message_dict["action"] == [
        "Only a model-serving offering scales to zero; stop and release other work."
    ]
    IdlePolicy(service=shop.service, action=IdleAction.RELEASE).full_clean()
    endpoint = factories.ServiceFactory(kind=ServiceKind.MODEL_SERVING, specs=[], images=[])
    IdlePolicy(service=endpoint, action=IdleAction.SCALE_TO_ZERO).full_clean()
    IdlePolicy(service=endpoint, action=IdleAction.RELEASE).full_clean()  # an endpoint may still be released
    deaf = IdlePolicy(service=endpoint, action=IdleAction.SCALE_TO_ZERO, watch_gateway=False)
    with pytest.raises(ValidationError) as refused:
        deaf.full_clean()
    assert refused.value.message_dict["watch_gateway"] == ["Scaling to zero needs the gateway calls watched."]
