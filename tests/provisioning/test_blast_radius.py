"""Cordon and isolate in the operator console name the running requests and owners they hit before confirming,
and the owners hear about it on their timeline."""

import pytest
from django.contrib.admin import helpers

from requests import services as request_services
from requests.choices import EventCode, RequestState
from scheduling import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(compute):
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    return request


def _ask(console, url: str, action: str, pk: int):
    return console.post(url, {"action": action, helpers.ACTION_CHECKBOX_NAME: [pk]})


def test_cordon_lists_who_keeps_running_there_and_tells_them(running, compute, console):
    url = "/admin/scheduling/node/"
    asked = _ask(console, url, "cordon_nodes", compute.node.pk).content.decode()
    affected = asked.split('id="affected"')[1].split("</table>")[0]
    assert f'data-request="{running.pk}"' in affected and running.requester.username in affected
    assert "Keeps running" in affected and "gpu0, gpu1" in affected
    done = console.post(
        url,
        {"action": "cordon_nodes", helpers.ACTION_CHECKBOX_NAME: [compute.node.pk], "apply": "1", "reason": "fan"},
    )
    assert done.status_code == 302
    told = running.events.get(code=EventCode.NODE_CORDONED)
    assert "fan" in told.message and compute.node.name in told.message


def test_isolating_a_busy_card_names_the_workspace_it_requeues(running, console, settings):
    settings.SCHEDULER_REQUEUE_ON_ISOLATION = True
    busy = running.allocations.get().devices.first().device
    url = "/admin/scheduling/device/"
    affected = _ask(console, url, "isolate_devices", busy.pk).content.decode().split('id="affected"')[1]
    assert running.requester.username in affected and "goes back to the queue" in affected
    console.post(
        url,
        {"action": "isolate_devices", helpers.ACTION_CHECKBOX_NAME: [busy.pk], "apply": "1", "reason": "xid 79"},
    )
    assert running.events.filter(code=EventCode.DEVICE_ISOLATED).exists()


def test_an_idle_node_says_nobody_is_affected(compute, console):
    asked = _ask(console, "/admin/scheduling/node/", "cordon_nodes", compute.node.pk).content.decode()
    assert "no request is affected" in asked


def test_the_cordon_note_follows_each_request_s_state(compute, settings, run_on_commit):
    """Only a running request's workload "keeps running there"; one being released or still set up hears that."""
    releasing = compute.order()
    request_services.request_release(request=releasing, actor=releasing.requester, reason="done")
    releasing.refresh_from_db()
    assert releasing.state == RequestState.RELEASING  # its teardown has not run yet (after-commit work held back)
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    settings.PROVISIONING_FAULTS = [{"op": "workload_ready", "result": {"ready": False}}]
    setting_up = compute.order()
    assert setting_up.state == RequestState.PROVISIONING

    services.node_cordon(node=compute.node, reason="fan", actor=None)

    told = {request.pk: request.events.get(code=EventCode.NODE_CORDONED).message for request in (releasing, setting_up)}
    assert told[releasing.pk] == (
        f"Node {compute.node.name} was cordoned by the platform: fan. The release of your workload there goes on; new "
        "placements avoid the node."
    )
    assert told[setting_up.pk] == (
        f"Node {compute.node.name} was cordoned by the platform: fan. Setting up your request there goes on; new "
        "placements avoid the node."
    )


def test_an_uncordon_places_the_queue_at_once(compute, run_on_commit):
    services.node_cordon(node=compute.node, reason="fan", actor=None)
    waiting = compute.order()
    assert waiting.state == RequestState.QUEUED

    run_on_commit(
        services.node_uncordon, node=compute.node, reason="fan replaced", actor=None
    )  # no cycle is run by the test

    waiting.refresh_from_db()
    assert waiting.state == RequestState.ACTIVE
