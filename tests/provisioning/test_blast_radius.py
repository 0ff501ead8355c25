"""Cordon and isolate in the operator console name the running requests and owners they hit before confirming,
and the owners hear about it on their timeline."""

import pytest
from django.contrib.admin import helpers

from requests.choices import EventCode, RequestState

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
