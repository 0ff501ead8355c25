"""Node agents are bound to their nodes: agent tokens (issued, shown once, hashed, revoked, audited), the role
matrix of POST /api/v1/health/events/ and /api/v1/health/runtime/, per-item not_your_node refusals, the console."""

import hashlib

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from config.errors import DomainError
from requests.choices import RequestState
from scheduling import cycle
from scheduling.choices import AllocationState
from scheduling.inventory.agents import agent_token_issue, agent_token_revoke
from scheduling.models import AgentToken, Allocation, Device, HealthEvent, Node, Rack, Site
from tenancy.models import AuditEvent
from tests import factories
from tests.queries import queries_for
from tests.scheduling.agent_tokens import agent_api
from tests.scheduling.health_inventory import ingest_user
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db

EVENTS, RUNTIME = "/api/v1/health/events/", "/api/v1/health/runtime/"


def xid_79(node_name: str, index: int = 0) -> dict:
    return {"node": node_name, "index": index, "source": "dcgm", "signal": "DCGM_FI_DEV_XID_ERRORS", "value": 79}


def isolated(node_name: str) -> list[bool]:
    return list(Device.objects.filter(node__name=node_name).order_by("index").values_list("isolated", flat=True))


@pytest.fixture
def two_nodes(shop):  # noqa: F811
    """Nodes "mine" and "theirs" in site dc1 (racks r1, r2), each with one running request."""
    site = Site.objects.create(name="dc1")
    mine, theirs = add_node(shop.accelerator, name="mine", cards=2), add_node(shop.accelerator, name="theirs", cards=2)
    Node.objects.filter(pk=mine.pk).update(rack=Rack.objects.create(site=site, name="r1"))
    Node.objects.filter(pk=theirs.pk).update(rack=Rack.objects.create(site=site, name="r2"))
    return mine, theirs


def running_on(node_name: str):
    return Allocation.objects.get(state=AllocationState.ACTIVE, node__name=node_name).request


@pytest.fixture
def placed(shop, team, two_nodes):  # noqa: F811
    queued(shop, team), queued(shop, team)
    cycle.run_cycle()
    return running_on("mine"), running_on("theirs")


def gone(client, *requests):
    return client.post(
        RUNTIME, {"reports": [{"request": request.pk, "status": "gone"} for request in requests]}, format="json"
    )


# --- the role matrix ---------------------------------------------------------------------------------------


def test_anonymous_and_bad_agent_tokens_are_401(api, two_nodes):
    assert api.post(EVENTS, {"events": [xid_79("mine")]}, format="json").status_code == 401
    for header in ("Agent cca_nope_nope", "Agent cca_00\x00_x", "Agent cca_0123abcd_x", "Agent", "Agent a b"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        response = client.post(EVENTS, {"events": [xid_79("mine")]}, format="json")
        assert response.status_code == 401 and set(response.json()) == {"code", "message", "details"}
    assert isolated("mine") == [False, False]


@pytest.mark.parametrize("who", ["developer", "approver", "lead", "other_developer", "operator"])
def test_users_without_an_agent_token_or_the_ingest_permission_are_403(api_as, roles, placed, who):
    """Requesters of the placed work, another tenant's developer, and an operator lacking ingest_health."""
    client = api_as(getattr(roles, who))
    response = gone(client, *placed)
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    assert all(Allocation.objects.get(request=request).state == AllocationState.ACTIVE for request in placed)
    assert client.post(EVENTS, {"events": [xid_79("mine")]}, format="json").status_code == 403
    assert isolated("mine") == [False, False]


def test_the_ingest_permission_alone_no_longer_speaks_for_every_node(api_as, placed):
    """The defect: any holder of ingest_health could report `gone` for any request id."""
    holder = factories.UserFactory()
    holder.user_permissions.add(*ingest_user().user_permissions.all())
    response = gone(api_as(holder), *placed)
    assert response.status_code == 403 and "agent token" in response.json()["message"]
    assert all(Allocation.objects.get(request=request).state == AllocationState.ACTIVE for request in placed)
    response = api_as(holder).post(EVENTS, {"events": [xid_79("theirs")]}, format="json")
    assert response.status_code == 403 and isolated("theirs") == [False, False]


def test_an_agent_of_another_node_is_refused_per_item_and_changes_nothing(two_nodes, placed):
    mine, _ = two_nodes
    ours, others = placed
    agent = agent_api([mine])
    response = agent.post(
        RUNTIME,
        {
            "reports": [
                {"request": ours.pk, "status": "running"},
                {"request": others.pk, "status": "gone"},
                {"request": others.pk + 1000, "status": "gone"},
            ]
        },
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["results"] == {
        str(ours.pk): "heartbeat",
        str(others.pk): "not_your_node",
        str(others.pk + 1000): "not_found",
    }
    assert body["refused"] == [
        {
            "code": "not_your_node",
            "message": body["refused"][0]["message"],
            "details": {"request": others.pk, "your_nodes": ["mine"]},
        }
    ]
    allocation = Allocation.objects.get(request=others)
    assert allocation.state == AllocationState.ACTIVE and allocation.heartbeat_at is None
    others.refresh_from_db()
    assert others.state == RequestState.ALLOCATED and not others.events.filter(code="releasing").exists()
    assert Allocation.objects.get(request=ours).heartbeat_at is not None


def test_an_agent_of_another_node_cannot_heartbeat_it_either(two_nodes, placed):
    mine, _ = two_nodes
    _, others = placed
    body = (
        agent_api([mine])
        .post(RUNTIME, {"reports": [{"request": others.pk, "status": "running"}]}, format="json")
        .json()
    )
    assert body["results"] == {str(others.pk): "not_your_node"}
    assert Allocation.objects.get(request=others).heartbeat_at is None


def test_an_agent_of_the_node_reclaims_its_own_workload(two_nodes, placed, django_capture_on_commit_callbacks):
    mine, _ = two_nodes
    ours, others = placed
    with django_capture_on_commit_callbacks(execute=True):
        body = gone(agent_api([mine]), ours).json()
    assert body == {"results": {str(ours.pk): "released"}, "refused": []}
    ours.refresh_from_db()
    assert ours.state == RequestState.RELEASED
    assert Allocation.objects.get(request=others).state == AllocationState.ACTIVE


def test_an_operator_speaks_for_any_node(api_as, placed, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        body = gone(api_as(ingest_user()), *placed).json()
    assert body["results"] == {str(request.pk): "released" for request in placed}


def test_health_events_about_another_node_are_refused_and_change_nothing(two_nodes):
    mine, _ = two_nodes
    events = [
        xid_79("mine", 0),
        xid_79("theirs", 1),
        {"device_uuid": "GPU-theirs-0", "source": "dcgm", "signal": "DCGM_FI_DEV_XID_ERRORS", "value": 79},
        {"node": "theirs", "source": "bmc", "signal": "Status.Health", "value": "Critical"},
    ]
    response = agent_api([mine]).post(EVENTS, {"events": events}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert [event["outcome"] for event in body["events"]] == [
        "matched",
        "not_your_node",
        "not_your_node",
        "not_your_node",
    ]
    assert [item["details"] for item in body["refused"]] == [
        {"target": {"node": "theirs", "index": 1}, "your_nodes": ["mine"]},
        {"target": {"device_uuid": "GPU-theirs-0"}, "your_nodes": ["mine"]},
        {"target": {"node": "theirs"}, "your_nodes": ["mine"]},
    ]
    assert {item["code"] for item in body["refused"]} == {"not_your_node"}
    assert isolated("mine") == [True, False] and isolated("theirs") == [False, False]
    assert set(HealthEvent.objects.values_list("device__node__name", flat=True)) == {"mine"}


def test_a_dcgm_scrape_from_another_nodes_agent_changes_nothing(two_nodes):
    _, theirs = two_nodes
    text = 'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-mine-0",Hostname="mine"} 79\n'
    response = agent_api([theirs]).generic("POST", EVENTS, text.encode(), content_type="text/plain; version=0.0.4")
    assert response.status_code == 200, response.json()
    assert [event["outcome"] for event in response.json()["events"]] == ["not_your_node"]
    assert isolated("mine") == [False, False] and not HealthEvent.objects.exists()


def test_a_site_token_speaks_for_the_sites_nodes_and_no_other(two_nodes):
    elsewhere = add_node(Device.objects.first().model, name="elsewhere", cards=1)
    Node.objects.filter(pk=elsewhere.pk).update(
        rack=Rack.objects.create(site=Site.objects.create(name="dc2"), name="r1")
    )
    agent = agent_api(site=Site.objects.get(name="dc1"))
    later = add_node(Device.objects.first().model, name="later", cards=1)  # joins dc1 after the token was issued
    Node.objects.filter(pk=later.pk).update(rack=Rack.objects.get(name="r1", site__name="dc1"))
    events = [xid_79("mine"), xid_79("theirs"), xid_79("later"), xid_79("elsewhere")]
    body = agent.post(EVENTS, {"events": events}, format="json").json()
    assert [event["outcome"] for event in body["events"]] == ["matched", "matched", "matched", "not_your_node"]
    assert body["refused"][0]["details"]["your_nodes"] == ["later", "mine", "theirs"]
    assert isolated("elsewhere") == [False]


def test_a_node_token_never_widens_to_its_site(two_nodes):
    mine, _ = two_nodes
    agent = agent_api([mine], site=Site.objects.get(name="dc1"))
    mine.delete()
    body = agent.post(EVENTS, {"events": [xid_79("theirs")]}, format="json").json()
    assert [event["outcome"] for event in body["events"]] == ["not_your_node"]
    assert body["refused"][0]["details"]["your_nodes"] == [] and isolated("theirs") == [False, False]


def test_a_revoked_token_stops_working_at_once(two_nodes, operator):
    mine, _ = two_nodes
    issued = agent_token_issue(name="a", nodes=[mine], actor=operator)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Agent {issued.secret}")
    assert client.post(EVENTS, {"events": [xid_79("mine", 1)]}, format="json").status_code == 200
    agent_token_revoke(token=issued.token, reason="host decommissioned", actor=operator)
    response = client.post(EVENTS, {"events": [xid_79("mine", 0)]}, format="json")
    assert response.status_code == 401 and response.json()["code"] == "authentication_failed"
    assert isolated("mine") == [False, True]
    with pytest.raises(DomainError) as twice:
        agent_token_revoke(token=issued.token, reason="again", actor=operator)
    assert twice.value.code == "token_revoked"


# --- tokens: issued once, stored hashed, audited --------------------------------------------------------------


def test_a_token_is_stored_as_a_hash_and_audited(two_nodes, operator):
    mine, theirs = two_nodes
    issued = agent_token_issue(name=" host-a ", nodes=[mine, theirs], site=Site.objects.get(name="dc1"), actor=operator)
    token = AgentToken.objects.get()
    assert issued.secret.startswith(f"cca_{token.prefix}_") and issued.secret not in (token.hashed, token.prefix)
    assert token.hashed == hashlib.sha256(issued.secret.encode()).hexdigest()
    assert token.name == "host-a" and token.created_by == operator and token.last_used_at is None
    audit = AuditEvent.objects.get(action="agent_token.issued")
    assert audit.actor == operator and audit.data == {"site": "dc1", "nodes": ["mine", "theirs"]}
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Agent {issued.secret}")
    client.post(EVENTS, {"events": [xid_79("mine")]}, format="json")
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_token_needs_nodes_or_a_site_and_listed_nodes_in_that_site(two_nodes):
    mine, _ = two_nodes
    with pytest.raises(DomainError) as nothing:
        agent_token_issue(name="a", nodes=[], actor=None)
    assert nothing.value.code == "nodes_required"
    with pytest.raises(DomainError) as outside:
        agent_token_issue(name="a", nodes=[mine], site=Site.objects.create(name="dc9"), actor=None)
    assert outside.value.code == "node_outside_site" and outside.value.details["nodes"] == ["mine"]
    assert not AgentToken.objects.exists() and not AuditEvent.objects.filter(action__startswith="agent").exists()


def test_the_command_issues_and_revokes(two_nodes, capsys):
    call_command("agent_token", "issue", "--name", "host-a", "--node", "mine")
    secret = capsys.readouterr().out.strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Agent {secret}")
    assert client.post(EVENTS, {"events": [xid_79("theirs")]}, format="json").json()["events"][0]["outcome"] == (
        "not_your_node"
    )
    call_command("agent_token", "revoke", AgentToken.objects.get().prefix, "--reason", "rotated")
    assert client.post(EVENTS, {"events": [xid_79("mine")]}, format="json").status_code == 401
    with pytest.raises(CommandError, match="No such node"):
        call_command("agent_token", "issue", "--name", "x", "--node", "nowhere")


# --- the operator console -------------------------------------------------------------------------------------


ADMIN = "/admin/scheduling/agenttoken/"


def test_an_operator_issues_a_token_in_the_console_and_sees_it_once(console, operator, two_nodes):
    mine, _ = two_nodes
    assert console.get(f"{ADMIN}add/").status_code == 200
    page = console.post(f"{ADMIN}add/", {"name": "host-a", "nodes": [mine.pk]})
    assert page.status_code == 200
    secret = page.context["secret"]
    assert secret in page.content.decode()
    token = AgentToken.objects.get()
    assert list(token.nodes.values_list("name", flat=True)) == ["mine"] and token.created_by == operator
    assert AuditEvent.objects.filter(action="agent_token.issued", actor=operator).count() == 1
    listing = console.get(ADMIN).content.decode()
    assert "host-a" in listing and secret not in listing and token.hashed not in listing
    assert secret not in console.get(f"{ADMIN}{token.pk}/change/").content.decode()


def test_a_console_refusal_is_shown_and_issues_nothing(console, two_nodes):
    page = console.post(f"{ADMIN}add/", {"name": "host-a"})
    assert page.status_code == 200 and "Name the nodes" in page.content.decode()
    assert not AgentToken.objects.exists()


def test_an_operator_revokes_with_a_reason(console, operator, two_nodes):
    mine, _ = two_nodes
    issued = agent_token_issue(name="a", nodes=[mine], actor=operator)
    console.post(
        ADMIN,
        {
            "action": "revoke_agent_tokens",
            "_selected_action": [issued.token.pk],
            "apply": "1",
            "reason": "host decommissioned",
        },
    )
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is not None
    assert AuditEvent.objects.get(action="agent_token.revoked").reason == "host decommissioned"


def test_the_token_list_runs_a_constant_number_of_queries(console, two_nodes):
    mine, theirs = two_nodes
    agent_token_issue(name="a", nodes=[mine], actor=None)
    few = queries_for(console, ADMIN)
    for name in "bcde":
        agent_token_issue(name=name, nodes=[mine, theirs], actor=None)
    agent_token_issue(name="f", nodes=[], site=Site.objects.get(name="dc1"), actor=None)
    assert queries_for(console, ADMIN) == few


def test_who_may_use_the_token_console(client, roles, two_nodes):
    client.force_login(roles.developer)
    assert client.get(f"{ADMIN}add/").status_code == 302  # not staff: the admin login
    staff = factories.UserFactory(is_staff=True)
    client.force_login(staff)
    assert client.get(f"{ADMIN}add/").status_code == 403
    assert client.post(f"{ADMIN}add/", {"name": "x", "nodes": [two_nodes[0].pk]}).status_code == 403
    assert not AgentToken.objects.exists()
