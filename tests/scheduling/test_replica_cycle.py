"""A model-serving request's replicas in the scheduling cycle on PostgreSQL: one allocation per replica, bound in
one cycle or not at all, spread over nodes (or sharing one, with a note on the record), released together, metered
per replica, preempted together, and the order preview saying where each replica would go."""

from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
import time_machine
from django.utils import timezone

from catalog.choices import ServiceKind
from metering.selectors import request_usage
from requests import services
from requests.choices import PriorityClass, RequestState
from requests.models import ResourceRequest
from requests.orders import Order, size_order
from scheduling import cycle, reclaim
from scheduling.allocations import allocation_details
from scheduling.choices import AllocationState
from scheduling.engine import CAPACITY_IN_USE, REPLICAS_SHARE_NODE
from scheduling.estimate import placement_estimate
from scheduling.models import Allocation, Device
from scheduling.services import device_isolate
from tenancy.services import quota_set
from tests import factories
from tests.module_data import shared_by_module
from tests.requests.conftest import GENEROUS_QUOTA
from tests.scheduling.test_cycle import add_node, device_totals_match_bindings

pytestmark = pytest.mark.django_db


@shared_by_module
def shop():
    """Serving on one card, 4 cores and 16 GiB a replica, three replicas; and a 1-card batch compute spec."""
    accelerator = factories.AcceleratorModelFactory(memory_gb=80)
    one_card = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=1, cpu_cores=4, memory_gb=16, hourly_price=Decimal("2")
    )
    template = factories.ServingTemplateFactory(spec=one_card, replicas=3)
    model = factories.ServingModelFactory(templates=[template])
    service = factories.ServiceFactory(kind=ServiceKind.MODEL_SERVING, specs=[one_card], images=[])
    service.serving_models.set([model])
    image = factories.ImageFactory()
    compute = factories.ServiceFactory(specs=[one_card], images=[image], max_duration_hours=168)
    return SimpleNamespace(
        accelerator=accelerator, spec=one_card, template=template, model=model, service=service, compute=compute
    )


@shared_by_module
def team():
    project = factories.project(quota=GENEROUS_QUOTA, max_priority=PriorityClass.CRITICAL)
    quota_set(
        quota=project.quota,
        limits={"concurrent_tasks": 100, "gpus": 64, "accelerator_memory_gb": 64 * 80, "cpu_cores": 512},
        actor=None,
    )
    return SimpleNamespace(project=project, developer=factories.member(project))


def serving_order(shop, team, priority=PriorityClass.STANDARD) -> Order:
    return Order(
        service=shop.service,
        project=team.project,
        duration_hours=8,
        spec=shop.spec,
        serving_model=shop.model,
        serving_template=shop.template,
        priority=priority,
    )


def submit(team, order: Order) -> ResourceRequest:
    request = services.request_submit(order=order, requester=team.developer)
    assert request.state == RequestState.QUEUED
    return request


def replicas_of(request) -> list[tuple[int, str, int]]:
    """(replica, node, devices) of the request's active allocations."""
    return [
        (allocation.replica, allocation.node.name, allocation.devices.count())
        for allocation in Allocation.objects.filter(request=request, state=AllocationState.ACTIVE)
        .select_related("node")
        .order_by("replica")
    ]


def test_three_replicas_get_an_allocation_each_on_three_nodes(shop, team):
    for name in ("a", "b", "c"):
        add_node(shop.accelerator, name=name, cards=4)
    request = submit(team, serving_order(shop, team))
    assert cycle.run_cycle().allocated == [request.pk]
    assert [(replica, devices) for replica, _node, devices in replicas_of(request)] == [(0, 1), (1, 1), (2, 1)]
    assert sorted(node for _replica, node, _devices in replicas_of(request)) == ["a", "b", "c"]
    assert {a.cpu_milli for a in Allocation.objects.filter(request=request)} == {4000}  # the spec's, per replica
    event = request.events.get(code="allocated")
    assert [r["replica"] for r in event.data["replicas"]] == [0, 1, 2] and event.data["spread"] is None
    details = allocation_details(request)
    assert sorted(details["nodes"]) == ["a", "b", "c"] and details["spread"] is None
    assert [len(replica["devices"]) for replica in details["replicas"]] == [1, 1, 1]
    device_totals_match_bindings()


def test_with_room_on_one_node_only_the_replicas_share_it_with_a_note_on_the_record(shop, team):
    add_node(shop.accelerator, name="a", cards=4)
    add_node(shop.accelerator, name="full", cards=0)
    request = submit(team, serving_order(shop, team))
    cycle.run_cycle()
    assert replicas_of(request) == [(0, "a", 1), (1, "a", 1), (2, "a", 1)]
    event = request.events.get(code="allocated")
    assert event.data["spread"]["code"] == REPLICAS_SHARE_NODE
    assert "replicas 0, 1, 2 share a" in event.message
    assert allocation_details(request)["spread"]["numbers"]["shared"] == {"a": [0, 1, 2]}


def test_the_replicas_are_placed_all_together_or_the_request_waits_with_the_reason(shop, team):
    add_node(shop.accelerator, name="a", cards=1)
    add_node(shop.accelerator, name="b", cards=1)
    request = submit(team, serving_order(shop, team))
    result = cycle.run_cycle()
    assert result.allocated == [] and result.waiting == {request.pk: CAPACITY_IN_USE}
    assert not Allocation.objects.filter(request=request).exists()
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}
    request.refresh_from_db()
    assert request.queue_reason["numbers"] == {"replicas": 3, "replicas_fitting": 2, "nodes": ["a", "b"]}
    assert "only 2 fit now" in request.queue_reason["message"]
    add_node(shop.accelerator, name="c", cards=1)
    assert cycle.run_cycle().allocated == [request.pk]
    assert sorted(node for _replica, node, _devices in replicas_of(request)) == ["a", "b", "c"]


def test_release_frees_every_replica_s_allocation(shop, team):
    for name in ("a", "b", "c"):
        add_node(shop.accelerator, name=name, cards=1)
    request = submit(team, serving_order(shop, team))
    cycle.run_cycle()
    freed = reclaim.allocation_free(request_ids=[request.pk], reason="released by its owner")
    assert len(freed) == 3
    assert set(Allocation.objects.filter(request=request).values_list("state", flat=True)) == {"released"}
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}
    assert allocation_details(request)["state"] == "released" and len(allocation_details(request)["replicas"]) == 3


def test_card_hours_and_cost_are_metered_per_replica_allocation(shop, team):
    for name in ("a", "b", "c"):
        add_node(shop.accelerator, name=name, cards=1)
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        request = submit(team, serving_order(shop, team))
        cycle.run_cycle()
    request.refresh_from_db()
    assert request.gpu_equivalents == 3  # the whole deployment's cards, as the quota counts them
    usage = request_usage(request, now=start + timedelta(hours=2))
    assert usage["card_hours"] == Decimal("6.0000")  # 3 replicas x 1 card x 2 h, not each replica as the whole
    assert usage["cost"] == Decimal(request.hourly_cost * 2).quantize(usage["cost"])


def test_the_preview_says_where_each_replica_would_go(shop, team):
    for name in ("a", "b", "c"):
        add_node(shop.accelerator, name=name, cards=2)
    order = serving_order(shop, team)
    estimate = placement_estimate(order, size_order(order))
    assert estimate["fits_now"] and sorted(estimate["nodes"]) == ["a", "b", "c"] and estimate["spread"] is None
    assert estimate["message"].startswith("Fits now on ")
    for name in ("a", "b", "c"):
        assert name in estimate["message"]


def test_preempting_a_replicated_request_frees_all_its_replicas(shop, team):
    add_node(shop.accelerator, name="a", cards=1)
    add_node(shop.accelerator, name="b", cards=1)
    shop.template.replicas = 2
    shop.template.save(update_fields=["replicas"])
    victim = submit(team, serving_order(shop, team, priority=PriorityClass.BATCH))
    cycle.run_cycle()
    assert sorted(node for _r, node, _d in replicas_of(victim)) == ["a", "b"]
    start = timezone.now()
    critical = submit(
        team,
        Order(
            service=shop.compute,
            project=team.project,
            duration_hours=4,
            spec=shop.spec,
            image=shop.compute.images.get(),
            priority=PriorityClass.CRITICAL,
        ),
    )
    with time_machine.travel(start, tick=False):
        cycle.run_cycle()
    marked = Allocation.objects.filter(request=victim, preempted_for=critical)
    assert marked.count() == 2  # the request is the victim: every replica's allocation
    with time_machine.travel(start + timedelta(seconds=301), tick=False):
        result = cycle.run_cycle()
    assert result.preempted == [victim.pk] and result.allocated == [critical.pk]
    victim.refresh_from_db()
    assert victim.state == RequestState.QUEUED and replicas_of(victim) == []
    device_totals_match_bindings()


def test_a_card_failing_under_one_replica_takes_only_that_replica_out(
    shop, team, settings, django_capture_on_commit_callbacks
):
    settings.SCHEDULER_REQUEUE_ON_ISOLATION = True
    for name in ("a", "b", "c"):
        add_node(shop.accelerator, name=name, cards=1)
    request = submit(team, serving_order(shop, team))
    cycle.run_cycle()
    with django_capture_on_commit_callbacks(execute=True):  # the requeue task runs (inline in tests)
        device_isolate(device=Device.objects.get(node__name="b"), reason="XID 79: fallen off the bus")
    request.refresh_from_db()
    assert request.state == RequestState.ALLOCATED and len(replicas_of(request)) == 3  # not requeued
    event = request.events.get(code="device_isolated")
    on_b = Allocation.objects.get(request=request, node__name="b").replica
    assert f"Replica {on_b} leaves the rotation; the deployment's other replicas keep serving." in event.message


def test_a_serving_request_goes_stale_only_when_every_replica_has(shop, team):
    for name in ("a", "b", "c"):
        add_node(shop.accelerator, name=name, cards=1)
    request = submit(team, serving_order(shop, team))
    cycle.run_cycle()
    now = timezone.now()
    allocations = Allocation.objects.filter(request=request)
    allocations.update(heartbeat_at=now)
    allocations.filter(replica=1).update(heartbeat_at=now - timedelta(hours=3))  # its node went quiet
    assert reclaim.reclaim_stale(now=now) == {}
    allocations.update(heartbeat_at=now - timedelta(hours=3))
    assert reclaim.reclaim_stale(now=now) == {request.pk: reclaim.RELEASED}


def test_the_request_record_shows_each_replica_with_its_node(shop, team, client):
    add_node(shop.accelerator, name="a", cards=2)
    add_node(shop.accelerator, name="b", cards=1)
    request = submit(team, serving_order(shop, team))
    cycle.run_cycle()
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(team.developer)
    record = api.get(f"/api/v1/requests/{request.pk}/").json()["allocation"]
    assert sorted(replica["node"] for replica in record["replicas"]) == ["a", "a", "b"]
    assert record["spread"]["code"] == REPLICAS_SHARE_NODE and len(record["spread"]["numbers"]["shared"]["a"]) == 2
    client.force_login(team.developer)
    page = client.get(f"/requests/{request.pk}/").content.decode()
    for replica in record["replicas"]:
        assert f"replica {replica['replica']} on <strong>{replica['node']}</strong>" in page
    assert 'data-code="replicas_share_node"' in page


def test_an_endpoint_woken_from_zero_asks_for_its_replicas_now_each_as_big_as_ordered():
    spec = {"accelerator_count": 1, "slice_profile": None, "accelerator_models": ["h100"]}
    serving = {"replicas": 3, "runtime": "simulated", "artifact_uri": "", "model": "m"}
    ordered = ResourceRequest(
        pk=7,
        priority=PriorityClass.STANDARD,
        cpu_cores=12,
        memory_gb=96,
        approved_spec={"spec": spec, "serving": serving},
    )
    whole = cycle.demand_of(ordered)
    ordered.serving_replicas = 1
    woken = cycle.demand_of(ordered)
    assert (whole.replicas, woken.replicas) == (3, 1)
    assert (woken.count, woken.cpu_milli, woken.memory_mib) == (whole.count, whole.cpu_milli, whole.memory_mib)
    assert (woken.count, woken.cpu_milli, woken.memory_mib) == (1, 4000, 32 * 1024)
