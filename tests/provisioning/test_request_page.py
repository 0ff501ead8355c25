"""The request page as one live status area: what it polls and when, that it never contradicts itself, its Connect
panel, the confirm steps of release/cancel/extend and key rotation (role matrix), redirects after every POST, the
rotation grace period, and constant query counts."""

from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from config.errors import DomainError
from requests import services as request_services
from requests.choices import EventCode, RequestState
from serving import keys
from tests import factories
from tests.queries import queries_for
from tests.requests.conftest import approval_rule, approver_stage, make_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def active(compute):
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    return request


def page_of(request) -> str:
    return reverse("portal:request-detail", args=[request.pk])


def status_of(request) -> str:
    return reverse("portal:request-status", args=[request.pk])


def status_area(client, request) -> str:
    answer = client.get(status_of(request))
    assert answer.status_code == 200
    return answer.content.decode()


def test_an_active_request_shows_how_to_connect_first_and_each_fact_once(active, client):
    client.force_login(active.requester)
    page = client.get(page_of(active)).content.decode()
    connect = page.split('id="connect"')[1].split("</section>")[0]
    assert "ssh -p" in connect and 'data-copy="ssh -p' in connect
    assert '<a href="https://' in connect  # Jupyter is a link
    assert "Expires in" in connect and reverse("portal:request-extend", args=[active.pk]) in connect
    assert page.index('id="connect"') < page.index('id="timeline"')
    assert page.count("GPU-n1-0") == 1  # node and devices once: on the allocation card
    assert page.count("ssh -p") == 2  # the command and its copy button, both in the Connect panel


def test_the_connect_panel_opens_the_workspace_in_an_ide_as_the_api_says(active, client, api_as):
    ide = api_as(active.requester).get(f"/api/v1/requests/{active.pk}/").json()["provisioning"]["delivered"]["ide"]
    user, host_port = ide["ssh_argv"][-1].split("@")[0], f"{ide['ssh_argv'][-1].split('@')[1]}:{ide['ssh_argv'][2]}"
    assert ide["vscode"] == f"vscode://vscode-remote/ssh-remote+{user}@{host_port}/home/{user}"
    assert ide["jetbrains_gateway"].startswith("jetbrains-gateway://connect#type=ssh&deploy=false&host=")
    assert ide["ssh_config"].startswith(f"Host cc-{active.pk}\n  HostName ")
    client.force_login(active.requester)
    connect = client.get(page_of(active)).content.decode().split('id="connect"')[1].split("</section>")[0]
    assert f'<a href="{ide["vscode"]}"' in connect
    assert f'<a href="{ide["jetbrains_gateway"].replace("&", "&amp;")}"' in connect
    assert f"<pre><code>Host cc-{active.pk}" in connect and 'data-access="ssh_config"' in connect


def test_a_queued_request_polls_quickly_and_shows_its_place(compute, client):
    compute.order(), compute.order()  # the 4-card node is full
    request = compute.order()
    assert request.state == RequestState.QUEUED
    client.force_login(request.requester)
    area = status_area(client, request)
    assert 'hx-trigger="every 3s"' in area and 'id="queue-status"' in area and "position 1" in area
    assert 'id="cancel"' in area and 'id="release"' not in area


def _order(compute):
    return make_order(compute.shop, compute.team.project)


def test_a_failed_request_says_failed_everywhere_and_offers_no_release(compute, client, settings):
    settings.PROVISIONING_FAULTS = [{"op": "start_workload", "code": "boom", "message": "Boom.", "retryable": False}]
    request = compute.order()
    assert request.state == RequestState.FAILED
    client.force_login(request.requester)
    area = status_area(client, request)
    assert 'id="request-state">Failed' in area and "Boom." in area
    assert 'Allocation <span class="badge">released' in area  # the failure's cleanup gave the devices back
    assert 'id="release"' not in area and 'id="extend"' not in area and 'id="connect"' not in area


def test_the_status_area_costs_the_same_queries_however_long_the_timeline(active, client):
    client.force_login(active.requester)
    few = queries_for(client, status_of(active))
    for n in range(10):
        request_services.record_event(request=active, actor=None, code=EventCode.DEVICE_ISOLATED, message=f"note {n}")
    assert queries_for(client, status_of(active)) == few <= 25


@pytest.mark.parametrize(
    ("who", "status", "act"),
    [
        ("anonymous", 302, 302),
        ("other_tenant", 404, 404),
        ("approver", 200, 403),
        ("lead", 200, 200),
        ("operator", 200, 200),
        ("requester", 200, 200),
    ],
)
def test_new_request_urls_follow_the_role_matrix(active, compute, client, who, status, act):
    team = compute.team
    users = {
        "other_tenant": factories.member(factories.project()),
        "approver": team.approver,
        "lead": team.lead,
        "operator": team.operator,
        "requester": active.requester,
    }
    if who in users:
        client.force_login(users[who])
    assert client.get(status_of(active)).status_code == status
    for name in ("portal:request-release", "portal:request-extend"):
        assert client.get(reverse(name, args=[active.pk])).status_code == act
    active.refresh_from_db()
    assert active.state == RequestState.ACTIVE  # asking changes nothing


@pytest.mark.parametrize(
    ("who", "status"),
    [("anonymous", 302), ("other_tenant", 404), ("approver", 403), ("lead", 200), ("operator", 403)],
)
def test_key_confirm_steps_follow_the_role_matrix(active, compute, client, who, status):
    key = keys.api_key_create(project=active.project, name="k", actor=active.requester).key
    users = {
        "other_tenant": factories.member(factories.project()),
        "approver": compute.team.approver,
        "lead": compute.team.lead,
        "operator": compute.team.operator,
    }
    if who in users:
        client.force_login(users[who])
    for name in ("serving-key-rotate", "serving-key-revoke"):
        assert client.get(reverse(name, args=[key.pk]), {"request": active.pk}).status_code == status
    key.refresh_from_db()
    assert key.active and key.replaced_by is None


def test_release_asks_with_its_blast_radius_then_redirects(active, client, run_on_commit):
    client.force_login(active.requester)
    url = reverse("portal:request-release", args=[active.pk])
    asked = client.get(url).content.decode()
    assert "Release request #" in asked and "n1" in asked and "2 devices" in asked and "<html" in asked
    dialog = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="confirm-consequences"' in dialog and "<html" not in dialog  # the dialog's content only
    done = run_on_commit(client.post, url, {"reason": "Finished"})
    assert done.status_code == 302 and done["Location"] == page_of(active)
    active.refresh_from_db()
    assert active.state == RequestState.RELEASED
    again = client.post(url, {"reason": "twice"})  # a resubmitted form is refused, on the page, not a second time
    assert again.status_code == 302
    assert "Finished" in active.events.filter(code=EventCode.RELEASING).get().message


def test_cancel_confirms_and_redirects(compute, client):
    approval_rule(approver_stage())
    request = request_services.request_submit(order=_order(compute), requester=compute.team.developer)
    assert request.state == RequestState.PENDING_APPROVAL
    client.force_login(request.requester)
    url = reverse("portal:request-cancel", args=[request.pk])
    assert "nothing was allocated to it yet" in client.get(url).content.decode()
    done = client.post(url, {"reason": "wrong project"})
    assert done.status_code == 302 and done["Location"] == page_of(request)
    request.refresh_from_db()
    assert request.state == RequestState.CANCELLED
    assert "hx-trigger" not in status_area(client, request)  # final: the page stops polling


def test_an_extension_without_a_reason_is_asked_again_and_a_complete_one_redirects(active, client):
    client.force_login(active.requester)
    url = reverse("portal:request-extend", args=[active.pk])
    refused = client.post(url, {"hours": "12", "justification": ""})
    assert refused.status_code == 400 and 'name="justification"' in refused.content.decode()
    sent = client.post(url, {"hours": "12", "justification": "one more epoch"})
    assert sent.status_code == 302 and sent["Location"] == page_of(active)
    assert active.extensions.count() == 1


def test_key_creation_redirects_and_a_reload_creates_nothing(active, client):
    client.force_login(active.requester)
    url = reverse("serving-key-create", args=[active.pk])
    created = client.post(url, {"name": "ci"})
    assert created.status_code == 302
    reloaded = client.get(url)  # what a browser does on reload after the redirect, or on a bookmarked form URL
    assert reloaded.status_code == 302 and reloaded["Location"].startswith(page_of(active))
    assert active.project.api_keys.filter(name="ci").count() == 1
    first = client.get(page_of(active)).content.decode()
    assert 'id="new-key"' in first
    assert 'id="new-key"' not in client.get(page_of(active)).content.decode()  # shown once


def test_rotation_keeps_the_old_key_for_the_grace_period_picked(active, client):
    issued = keys.api_key_create(project=active.project, name="frontend", actor=active.requester)
    client.force_login(active.requester)
    url = reverse("serving-key-rotate", args=[issued.key.pk])
    asked = client.get(url, {"request": active.pk}).content.decode()
    assert '<option value="24" selected>' in asked  # 24 h unless the user picks otherwise
    rotated = client.post(f"{url}?request={active.pk}", {"grace_hours": "1"})
    assert rotated.status_code == 302
    new_secret = client.get(page_of(active)).content.decode().split('id="new-key-secret">')[1].split("<")[0]
    issued.key.refresh_from_db()
    assert abs(issued.key.expires_at - (timezone.now() + timedelta(hours=1))) < timedelta(seconds=30)
    assert keys.api_key_authenticate(issued.secret) == issued.key  # still works during the grace period
    with time_machine.travel(timezone.now() + timedelta(hours=1, minutes=1)):
        assert keys.api_key_authenticate(issued.secret) is None
        assert keys.api_key_authenticate(new_secret).name == "frontend"


def test_rotation_refuses_a_grace_period_out_of_range(active):
    key = keys.api_key_create(project=active.project, name="k", actor=active.requester).key
    with pytest.raises(DomainError) as refused:
        keys.api_key_rotate(key=key, actor=active.requester, grace_hours=keys.ROTATION_GRACE_HOURS_MAX + 1)
    assert refused.value.code == "grace_out_of_range"
    key.refresh_from_db()
    assert key.replaced_by is None
