"""The scheduling cycle end to end on PostgreSQL: queue -> engine -> allocations, reasons, release, expiry."""

import gc
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from requests import approvals, services
from requests.choices import OverQuota, PriorityClass, RequestState
from requests.models import ResourceRequest
from scheduling import cycle, reason_words, reclaim
from scheduling.choices import AllocationState
from scheduling.models import Allocation, AllocationDevice, Device, Node
from tenancy.choices import Role
from tenancy.services import quota_set
from tests import factories
from tests.module_data import shared_by_module
from tests.requests.conftest import GENEROUS_QUOTA, make_order
from tests.scheduling.agent_tokens import agent_api
from tests.scheduling.inventory_helpers import end_terms_at

pytestmark = pytest.mark.django_db
# Placed requests: provisioning moves them on from allocated when after-commit work runs.
HOLDING = [RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE]


@shared_by_module
def shop():
    """A compute service: whole cards (2 per request) and a 1g slice spec, on one 80 GB accelerator model."""
    from types import SimpleNamespace

    accelerator = factories.AcceleratorModelFactory(memory_gb=80)
    slice_profile = factories.SliceProfileFactory(
        accelerator=accelerator, name="1g.10gb", compute_fraction=Decimal("0.1429"), memory_gb=10
    )
    whole = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=2, cpu_cores=8, memory_gb=64
    )
    sliced = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=1, slice_profile=slice_profile, cpu_cores=1, memory_gb=8
    )
    image = factories.ImageFactory()
    service = factories.ServiceFactory(specs=[whole, sliced], images=[image], max_duration_hours=168)
    return SimpleNamespace(service=service, whole=whole, sliced=sliced, image=image, accelerator=accelerator)


@shared_by_module
def team():
    from types import SimpleNamespace

    project = factories.project(quota=GENEROUS_QUOTA, max_priority=PriorityClass.HIGH)  # may order high itself
    return SimpleNamespace(
        project=project,
        developer=factories.member(project),
        operator=factories.operator(),
        approver=factories.member(project, Role.APPROVER),
    )


def add_node(accelerator, name="n1", cards=4, cpu_cores=64, memory_gb=512) -> Node:
    node = Node.objects.create(
        name=name, serial_number=f"sn-{name}", cpu_milli=cpu_cores * 1000, memory_mib=memory_gb * 1024
    )
    for index in range(cards):
        Device.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}", model=accelerator, memory_gb=80)
    return node


def queued(shop, team, spec=None, priority=PriorityClass.STANDARD, **order) -> ResourceRequest:
    request = services.request_submit(
        order=make_order(shop, team.project, spec=spec, priority=priority, **order), requester=team.developer
    )
    assert request.state == RequestState.QUEUED  # no approval policy: approved automatically
    return request


def device_totals_match_bindings():
    """The database's own accounting: allocated_milli equals the sum of active bindings, never above 1000."""
    for device in Device.objects.all():
        bound = (
            AllocationDevice.objects.filter(device=device, allocation__state=AllocationState.ACTIVE).aggregate(
                total=Sum("milli")
            )["total"]
            or 0
        )
        assert device.allocated_milli == bound <= 1000, device


def test_cycle_allocates_queued_requests_onto_free_cards(shop, team):
    add_node(shop.accelerator)
    first, second = queued(shop, team), queued(shop, team)
    result = cycle.run_cycle()
    assert sorted(result.allocated) == sorted([first.pk, second.pk])
    for request in (first, second):
        request.refresh_from_db()
        assert request.state == RequestState.ALLOCATED
        assert request.events.filter(code="allocated").exists()
        allocation = request.allocations.get()
        assert allocation.devices.count() == 2
        lasts = allocation.expires_at - allocation.started_at
        assert abs(lasts - timedelta(hours=request.duration_hours)) < timedelta(seconds=5)
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {1000}
    device_totals_match_bindings()


def test_seven_slices_share_one_card(shop, team):
    add_node(shop.accelerator, cards=1)
    requests = [queued(shop, team, spec=shop.sliced) for _ in range(8)]
    result = cycle.run_cycle()
    assert len(result.allocated) == 7
    waiting = ResourceRequest.objects.get(pk=requests[-1].pk)
    assert waiting.queue_reason["code"] in {"capacity_in_use", "fragmentation"}
    device_totals_match_bindings()


def test_waiting_requests_show_position_and_reason_with_numbers(shop, team, api_as):
    add_node(shop.accelerator, cards=2)
    running, blocked, behind = queued(shop, team), queued(shop, team), queued(shop, team)
    cycle.run_cycle()
    body = api_as(team.developer).get(f"/api/v1/requests/{blocked.pk}/").json()
    assert body["state"] == "queued"
    assert body["queue"]["position"] == 1 and body["queue"]["code"] == "capacity_in_use"
    assert body["queue"]["message"]
    queue = api_as(team.developer).get("/api/v1/queue/").json()["results"]
    assert [row["id"] for row in queue] == [blocked.pk, behind.pk]
    assert running.pk not in [row["id"] for row in queue]


@pytest.mark.parametrize(
    "setup, code",
    [
        ("no_devices", "no_matching_spec"),
        ("isolated", "insufficient_healthy_capacity"),
        ("concurrency", "quota_exhausted"),
    ],
)
def test_reason_codes_reach_the_api(shop, team, api_as, setup, code):
    if setup == "isolated":
        node = add_node(shop.accelerator, cards=2)
        node.devices.update(isolated=True, isolation_reason="XID 79")
    if setup == "concurrency":
        add_node(shop.accelerator, cards=8)
    first, request = queued(shop, team), queued(shop, team)
    if setup == "concurrency":  # the limit was lowered after both were admitted
        quota_set(quota=team.project.quota, limits={"concurrent_tasks": 1}, actor=None)
    cycle.run_cycle()
    body = api_as(team.developer).get(f"/api/v1/requests/{request.pk}/").json()
    assert body["state"] == "queued"
    assert body["queue"]["code"] == code
    assert body["queue"]["message"]
    if setup == "concurrency":
        assert body["queue"]["numbers"] == {"holding": 1, "limit": 1}
        first.refresh_from_db()
        assert first.state == RequestState.ALLOCATED


def test_an_approved_exception_over_the_concurrent_task_limit_runs(shop, team):
    """The exception is granted at admission; the scheduler must not refuse it again for the same limit."""
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 1}, actor=None)
    add_node(shop.accelerator, cards=8)
    running = queued(shop, team)
    cycle.run_cycle()
    running.refresh_from_db()
    assert running.state == RequestState.ALLOCATED
    beyond = services.request_submit(
        order=make_order(shop, team.project, justification="release deadline"),
        requester=team.developer,
        over_quota=OverQuota.EXCEPTION,
    )
    assert beyond.state == RequestState.PENDING_APPROVAL and beyond.quota_exception
    [assignment] = approvals.approval_for(beyond).stages.get().assignments.filter(approver=team.operator)
    approvals.approval_decide(assignment=assignment, decision="approve", comment="ok", actor=team.operator)
    assert cycle.run_cycle().allocated == [beyond.pk]
    beyond.refresh_from_db()
    assert beyond.state == RequestState.ALLOCATED


def test_higher_priority_runs_first_and_holds_back_lower(shop, team):
    add_node(shop.accelerator, cards=2)
    low = queued(shop, team, priority=PriorityClass.BATCH)
    high = queued(shop, team, priority=PriorityClass.HIGH)
    cycle.run_cycle()
    high.refresh_from_db()
    low.refresh_from_db()
    assert high.state == RequestState.ALLOCATED and low.state == RequestState.QUEUED


def test_database_refuses_to_overcommit_a_card(shop, team):
    node = add_node(shop.accelerator, cards=1)
    device = node.devices.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        cycle._bind_devices([(device.pk, 600), (device.pk, 600)])
    Device.objects.filter(pk=device.pk).update(allocated_milli=1000)
    with pytest.raises(IntegrityError), transaction.atomic():
        cycle._bind_devices([(device.pk, 1)])


def test_release_returns_devices_and_ends_released(shop, team, django_capture_on_commit_callbacks):
    add_node(shop.accelerator, cards=2)
    request = queued(shop, team)
    cycle.run_cycle()
    request.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        services.request_release(request=request, actor=team.developer, reason="done early")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert list(request.events.values_list("code", flat=True))[-2:] == ["releasing", "released"]
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}
    assert Allocation.objects.get().state == AllocationState.RELEASED


def test_release_by_someone_else_is_refused(shop, team):
    add_node(shop.accelerator, cards=2)
    request = queued(shop, team)
    cycle.run_cycle()
    stranger = factories.member(team.project, Role.APPROVER)
    with pytest.raises(services.NotPermitted):
        services.request_release(request=request, actor=stranger, reason="mine now")


def test_expiry_warns_then_reclaims(shop, team, django_capture_on_commit_callbacks):
    add_node(shop.accelerator, cards=2)
    request = queued(shop, team)  # 10 hours
    with django_capture_on_commit_callbacks(execute=True):
        cycle.run_cycle()  # placed and provisioned: running, which is what a warning is for
    start = timezone.now()
    with time_machine.travel(start + timedelta(hours=7), tick=False):
        assert reclaim.warn_expiring() == 1
        assert reclaim.warn_expiring() == 0  # once
        assert reclaim.reclaim_expired() == {}
    with (
        time_machine.travel(start + timedelta(hours=10, minutes=1), tick=False),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert reclaim.reclaim_expired() == {request.pk: "released"}
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert request.events.filter(code="expiry_warning").count() == 1
    assert "expired" in request.events.get(code="releasing").message


def test_stale_allocation_without_heartbeat_is_reclaimed(shop, team, settings, django_capture_on_commit_callbacks):
    settings.ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES = 30
    add_node(shop.accelerator, cards=2)
    request = queued(shop, team)
    cycle.run_cycle()
    Allocation.objects.update(heartbeat_at=timezone.now() - timedelta(minutes=31))
    with django_capture_on_commit_callbacks(execute=True):
        assert reclaim.reclaim_stale() == {request.pk: "released"}
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert "no heartbeat" in request.events.get(code="releasing").message


def test_reclaim_reports_each_item_and_a_release_in_progress_as_already_releasing(shop, team):
    """The user's release has started but its teardown has not returned the devices (after-commit work never runs
    here): the allocation is still active, and the batch says so instead of stopping at it."""
    add_node(shop.accelerator, cards=6)
    first, releasing, last = (queued(shop, team) for _ in range(3))
    cycle.run_cycle()
    services.request_release(request=releasing, actor=team.developer, reason="done early")
    end_terms_at(timezone.now() - timedelta(minutes=1))
    assert reclaim.reclaim_expired() == {first.pk: "released", releasing.pk: "already_releasing", last.pk: "released"}
    assert reclaim.runtime_report(reports=[(releasing.pk, "running"), (last.pk, "gone"), (10**9, "gone")]).results == {
        releasing.pk: "heartbeat",
        last.pk: "already_releasing",
        10**9: "not_found",
    }
    assert reclaim.reclaim_expired() == dict.fromkeys([first.pk, releasing.pk, last.pk], "already_releasing")


def test_cycle_query_count_does_not_grow_with_requests(shop, team):
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 1000}, actor=None)
    for name in ("a", "b", "c", "d"):
        add_node(shop.accelerator, name=name, cards=8)

    def measured(count):
        for _ in range(count):
            queued(shop, team, spec=shop.sliced)
        with CaptureQueriesContext(connection) as queries:
            cycle.run_cycle()
        return len(queries)

    reason_words.named("")  # the catalog's names a process keeps: read by its first cycle, not by every cycle
    assert measured(3) == measured(30)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_concurrent_cycles_submissions_and_releases_never_bind_a_device_twice(shop, team):
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 1000}, actor=None)
    add_node(shop.accelerator, name="x", cards=2)
    add_node(shop.accelerator, name="y", cards=2)
    requests = [queued(shop, team, spec=shop.sliced) for _ in range(20)] + [queued(shop, team) for _ in range(4)]
    barrier = threading.Barrier(4)
    errors = []

    def worker(index):
        try:
            barrier.wait()
            for _ in range(3):
                cycle.run_cycle()
                if index == 1:  # submissions race the cycles and the releases
                    queued(shop, team, spec=shop.sliced)
                if index == 0:
                    for request in ResourceRequest.objects.filter(state__in=HOLDING)[:2]:
                        try:
                            services.request_release(request=request, actor=None, reason="test churn")
                            reclaim.allocation_free(request_ids=[request.pk], reason="test churn")
                        except services.Conflict:
                            pass  # another thread got there first
        except Exception as error:  # surfaced below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    device_totals_match_bindings()
    assert ResourceRequest.objects.filter(pk__in=[r.pk for r in requests], state__in=HOLDING).exists()


def test_preview_says_where_an_order_fits_now_or_what_it_would_wait_behind(shop, team, api_as):
    add_node(shop.accelerator, name="only", cards=2)
    body = {
        "service": shop.service.pk,
        "project": team.project.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
    }
    preview = api_as(team.developer).post("/api/v1/requests/preview/", body, format="json").json()
    assert "placement" in preview, preview
    assert preview["placement"]["fits_now"] is True and preview["placement"]["node"] == "only"
    queued(shop, team)  # takes both cards once scheduled
    preview = api_as(team.developer).post("/api/v1/requests/preview/", body, format="json").json()
    assert preview["placement"]["fits_now"] is False
    assert preview["placement"]["queued_ahead"] == 1
    assert preview["placement"]["code"] == "capacity_in_use"


def test_head_of_line_reservation_lets_only_harmless_work_backfill(shop, team):
    """A two-card request waits for a running slice to end; a younger 10-hour slice would still be running then
    on the only node that can take it, so it waits; a 1-hour slice ends in time and backfills."""
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 1000}, actor=None)
    add_node(shop.accelerator, name="only", cards=2)
    queued(shop, team, spec=shop.sliced)  # 10 hours on one card
    cycle.run_cycle()
    big = queued(shop, team)  # needs both cards: crowded out until the slice ends
    cycle.run_cycle()
    big.refresh_from_db()
    assert big.queue_reason["code"] in {"capacity_in_use", "fragmentation"}
    long_slice = queued(shop, team, spec=shop.sliced)
    short_slice = queued(shop, team, spec=shop.sliced, duration_hours=1)
    cycle.run_cycle()
    long_slice.refresh_from_db()
    short_slice.refresh_from_db()
    assert long_slice.state == RequestState.QUEUED
    assert long_slice.queue_reason["code"] == "higher_priority_ahead"
    assert long_slice.queue_reason["numbers"]["reserved_for"] == str(big.pk)
    assert long_slice.queue_reason["numbers"]["node"] == "only"
    assert short_slice.state == RequestState.ALLOCATED


def test_fair_share_puts_the_lighter_project_first_within_a_class(shop, team, settings):
    from requests.quota import month_start
    from tenancy.models import MonthlyUsage

    settings.SCHEDULER_FAIR_SHARE = True
    heavy = queued(shop, team)
    light_project = factories.project(quota=GENEROUS_QUOTA)
    light = services.request_submit(order=make_order(shop, light_project), requester=factories.member(light_project))
    MonthlyUsage.objects.create(project=team.project, month=month_start(), card_hours=Decimal(500))
    assert [r.pk for r in cycle.queue_order([heavy, light])] == [light.pk, heavy.pk]
    settings.SCHEDULER_FAIR_SHARE = False
    assert [r.pk for r in cycle.queue_order([heavy, light])] == [heavy.pk, light.pk]


def test_isolating_a_busy_card_requeues_its_request_elsewhere(shop, team, django_capture_on_commit_callbacks):
    from scheduling.services import device_isolate

    first = add_node(shop.accelerator, name="a", cards=2)
    request = queued(shop, team)
    cycle.run_cycle()
    assert request.allocations.get().node == first
    add_node(shop.accelerator, name="b", cards=2)
    with django_capture_on_commit_callbacks(execute=True):
        device_isolate(device=first.devices.get(index=0), reason="XID 79: fallen off the bus")
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE  # placed again, and provisioned there
    assert request.allocations.get(state=AllocationState.ACTIVE).node.name == "b"
    codes = list(request.events.values_list("code", flat=True))
    assert "device_isolated" in codes and "preempted" in codes
    device_totals_match_bindings()


def test_with_requeue_off_the_request_keeps_its_card(shop, team, settings, django_capture_on_commit_callbacks):
    from scheduling.services import device_isolate

    settings.SCHEDULER_REQUEUE_ON_ISOLATION = False
    node = add_node(shop.accelerator, cards=2)
    request = queued(shop, team)
    cycle.run_cycle()
    with django_capture_on_commit_callbacks(execute=True):
        device_isolate(device=node.devices.get(index=0), reason="ECC")
    request.refresh_from_db()
    assert request.state == RequestState.ALLOCATED and request.allocations.count() == 1
    assert "still holds it" in request.events.get(code="device_isolated").message


def test_runtime_reports_refresh_heartbeats_and_reclaim_gone_workloads(shop, team, django_capture_on_commit_callbacks):
    runtime_agent = agent_api([add_node(shop.accelerator, cards=4)])
    alive, dead = queued(shop, team), queued(shop, team)
    cycle.run_cycle()
    with django_capture_on_commit_callbacks(execute=True):
        response = runtime_agent.post(
            "/api/v1/health/runtime/",
            {
                "reports": [
                    {"request": alive.pk, "status": "running"},
                    {"request": dead.pk, "status": "gone"},
                    {"request": 999999, "status": "running"},
                ]
            },
            format="json",
        )
    assert response.status_code == 200
    assert response.json() == {
        "results": {str(alive.pk): "heartbeat", str(dead.pk): "released", "999999": "not_found"},
        "refused": [],
    }
    assert Allocation.objects.get(request=alive).heartbeat_at is not None
    dead.refresh_from_db()
    assert dead.state == RequestState.RELEASED
    assert "workload gone" in dead.events.get(code="releasing").message


def test_runtime_reports_need_the_ingest_permission(shop, team, api_as, api):
    assert api.post("/api/v1/health/runtime/", {"reports": []}, format="json").status_code == 401
    response = api_as(team.developer).post(
        "/api/v1/health/runtime/", {"reports": [{"request": 1, "status": "gone"}]}, format="json"
    )
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"


def test_topology_and_priority_reasons_reach_the_api(shop, team, api_as):
    """Two nodes with one healthy card each: a two-card request has the cards, but not on one node
    (topology_constraint); a pending high-priority request then holds back a lower one that would fit
    (higher_priority_ahead)."""
    for name in ("left", "right"):  # two cards each, one of them isolated: one healthy card per node
        add_node(shop.accelerator, name=name, cards=2).devices.filter(index=1).update(
            isolated=True, isolation_reason="XID 79"
        )
    pair = queued(shop, team)  # 2 whole cards on one node
    cycle.run_cycle()
    body = api_as(team.developer).get(f"/api/v1/requests/{pair.pk}/").json()
    assert body["queue"]["code"] == "topology_constraint", body["queue"]
    high = queued(shop, team, priority=PriorityClass.HIGH)  # also 2 cards: pending, and it outranks what follows
    low = queued(shop, team, spec=shop.sliced)
    cycle.run_cycle()
    body = api_as(team.developer).get(f"/api/v1/requests/{low.pk}/").json()
    assert body["queue"]["code"] == "higher_priority_ahead"
    assert body["queue"]["numbers"]["blocked_by"] == str(high.pk)


# --- never fits ------------------------------------------------------------------------------------------------


@pytest.fixture
def eight_cards(shop):
    """8 cards with 128 vCPU, offered by the shop's service; the nodes below have 112 cores."""
    spec = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=8, cpu_cores=128, memory_gb=1024
    )
    shop.service.specs.add(spec)
    for name in ("big-1", "big-2"):
        add_node(shop.accelerator, name=name, cards=8, cpu_cores=112, memory_gb=2048)
    return spec


NEVER_FITS = {"dimension": "cpu_cores", "needed": 128, "largest": 112, "node": "big-1"}


def test_a_request_no_node_could_ever_hold_waits_as_no_matching_spec_not_capacity_in_use(
    shop, team, eight_cards, api_as
):
    request = queued(shop, team, spec=eight_cards)
    cycle.run_cycle()
    queue = api_as(team.developer).get(f"/api/v1/requests/{request.pk}/").json()["queue"]
    assert (queue["code"], queue["numbers"]) == ("no_matching_spec", NEVER_FITS)
    assert "no node has 128 cores" in queue["message"]


def never_fitting_order(shop, team, eight_cards, **extra) -> dict:
    """The API body of an order for the eight-card spec no node of the inventory can hold."""
    return {
        "service": shop.service.pk,
        "project": team.project.pk,
        "spec": eight_cards.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
        **extra,
    }


def test_the_preview_says_an_order_never_fits_and_why(shop, team, eight_cards, api_as):
    body = never_fitting_order(shop, team, eight_cards)
    placement = api_as(team.developer).post("/api/v1/requests/preview/", body, format="json").json()["placement"]
    assert placement["fits_now"] is False and placement["never_fits"] is True
    assert (placement["code"], placement["details"]) == ("no_matching_spec", NEVER_FITS)


def test_submission_refuses_or_warns_about_an_order_that_never_fits_as_the_order_chooses(
    shop, team, eight_cards, api_as
):
    body = never_fitting_order(shop, team, eight_cards)
    client = api_as(team.developer)
    refused = client.post("/api/v1/requests/", {**body, "if_unplaceable": "refuse"}, format="json")
    assert refused.status_code == 422, refused.json()
    assert (refused.json()["code"], refused.json()["details"]) == ("no_matching_spec", NEVER_FITS)
    assert not ResourceRequest.objects.exists()
    warned = client.post("/api/v1/requests/", body, format="json")  # warn is the default
    assert warned.status_code == 201, warned.json()
    submitted = ResourceRequest.objects.get().events.get(code="submitted")
    assert submitted.data["never_fits"]["details"] == NEVER_FITS
    assert "no node has 128 cores" in submitted.message
    fitting = client.post(
        "/api/v1/requests/", {**body, "spec": shop.whole.pk, "if_unplaceable": "refuse"}, format="json"
    )
    assert fitting.status_code == 201, fitting.json()
    assert "never_fits" not in ResourceRequest.objects.get(pk=fitting.json()["id"]).events.get(code="submitted").data


def test_never_fits_reads_the_inventory_once_per_change_one_node_of_each_type(
    shop, team, eight_cards, api_as, django_assert_num_queries
):
    from scheduling.estimate import inventory_types

    assert [node.name for node in inventory_types()] == ["big-1"]  # big-2 is the same type
    with django_assert_num_queries(1):  # unchanged: only the inventory's version is read
        assert [node.name for node in inventory_types()] == ["big-1"]
    body = never_fitting_order(shop, team, eight_cards, if_unplaceable="refuse")
    client = api_as(team.developer)
    assert client.post("/api/v1/requests/", body, format="json").status_code == 422

    add_node(shop.accelerator, name="bigger", cards=8, cpu_cores=128, memory_gb=2048)
    assert client.post("/api/v1/requests/", body, format="json").status_code == 201
    bigger = Node.objects.get(name="bigger")
    bigger.cpu_milli = 64_000  # an edit, no new row, is seen too
    bigger.save()
    assert client.post("/api/v1/requests/", body, format="json").status_code == 422
    assert [node.name for node in inventory_types()] == ["big-1", "bigger"]
    Node.objects.filter(name="bigger").update(updated_at=timezone.now())  # nothing the engine sees changed
    with django_assert_num_queries(1):
        assert [node.name for node in inventory_types()] == ["big-1", "bigger"]


def test_the_order_page_refuses_an_order_that_never_fits_when_asked_to(client, shop, team, eight_cards):
    client.force_login(team.developer)
    form = {
        "project": team.project.pk,
        "spec": eight_cards.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
        "priority": "standard",
        "environment": "development",
        "over_quota": "reject",
    }
    page = client.get(f"/order/{shop.service.slug}/").content.decode()
    assert 'name="if_unplaceable" value="refuse"' in page
    response = client.post(f"/order/{shop.service.slug}/", {**form, "if_unplaceable": "refuse"})
    assert response.status_code == 422
    assert "no_matching_spec" in response.content.decode() and "no node has 128 cores" in response.content.decode()
    assert not ResourceRequest.objects.exists()
    assert client.post(f"/order/{shop.service.slug}/", form).status_code == 302  # unchosen: submitted, with a warning


def test_the_garbage_collector_is_paused_for_a_cycle_and_on_again_after_it(monkeypatch):
    """A cycle runs with the cyclic collector paused (its full passes walked the kept engine about ten times a cycle
    at 10x) and turns it on again however the cycle ended; a caller that paused it keeps it paused."""
    seen = []

    def fake_cycle(policy):
        seen.append(gc.isenabled())
        if len(seen) == 2:
            raise RuntimeError("the cycle failed")
        return cycle.CycleResult(ran=False)

    monkeypatch.setattr(cycle, "_cycle", fake_cycle)
    cycle._timed_cycle("default")
    with pytest.raises(RuntimeError):
        cycle._timed_cycle("default")
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        cycle._timed_cycle("default")
        assert not gc.isenabled()
    finally:
        gc.enable()
