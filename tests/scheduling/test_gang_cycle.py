"""Multi-node gangs in the cycle and the preview: while no node here has a backend that runs multi-node work (Slurm,
containers), an approved gang waits with `multi_node_backend` rather than be placed and fail; the preview says so, or
gives the gang's topology reason with its numbers (and when its best rack frees the nodes it lacks) when it would
wait anyway. On Slurm nodes the cycle places the whole gang in
one transaction, one allocation per member, and ending the request ends all of them. One-node work is placed as
before."""

from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from catalog.choices import TopologyLevel, TopologyMode
from metering.selectors import request_usage
from requests import services
from requests.choices import EventCode, PriorityClass, RequestState
from requests.models import ResourceRequest
from requests.orders import size_order
from scheduling import backends, cycle, reclaim
from scheduling import services as scheduling_services
from scheduling.allocations import allocation_details
from scheduling.choices import AllocationState
from scheduling.estimate import placement_estimate
from scheduling.models import RUN_ANCHOR, Allocation, Device, Node, Rack, Site
from scheduling.preemption import PREEMPTION_PENDING
from tests import factories
from tests.module_data import shared_by_module
from tests.requests.conftest import GENEROUS_QUOTA, make_order

pytestmark = pytest.mark.django_db


@shared_by_module
def shop():
    accelerator = factories.AcceleratorModelFactory(slug="h100-80gb", name="H100 80GB", memory_gb=80)
    one = factories.ResourceSpecFactory(accelerator_models=[accelerator], accelerator_count=1, cpu_cores=8)
    gang = factories.ResourceSpecFactory(
        accelerator_models=[accelerator],
        accelerator_count=4,
        cpu_cores=8,
        memory_gb=64,
        hourly_price=Decimal("1.00"),
        node_count=2,
        topology_level=TopologyLevel.RACK,
        topology_mode=TopologyMode.REQUIRED,
    )
    image = factories.ImageFactory()
    service = factories.ServiceFactory(specs=[one, gang], images=[image], max_duration_hours=168)
    return SimpleNamespace(service=service, one=one, gang=gang, image=image, accelerator=accelerator)


@shared_by_module
def team():
    project = factories.project(quota=GENEROUS_QUOTA)
    return SimpleNamespace(project=project, developer=factories.member(project))


def add_node(accelerator, name: str, rack: Rack, cards: int = 4, backend: str = "simulated") -> Node:
    node = Node.objects.create(
        name=name,
        serial_number=f"sn-{name}",
        cpu_milli=64_000,
        memory_mib=512 * 1024,
        rack=rack,
        execution_backend=backend,
    )
    for index in range(cards):
        Device.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}", model=accelerator, memory_gb=80)
    return node


def racks(accelerator, *sizes: int, backend: str = "simulated") -> None:
    site, _ = Site.objects.get_or_create(name="dc")
    for number, size in enumerate(sizes, start=Rack.objects.count() + 1):
        rack = Rack.objects.create(site=site, name=f"r{number}")
        for position in range(size):
            add_node(accelerator, f"r{number}-n{position}", rack, backend=backend)


def submit(shop, team, spec) -> ResourceRequest:
    return services.request_submit(order=make_order(shop, team.project, spec=spec), requester=team.developer)


def test_a_gang_waits_for_a_multi_node_backend_while_one_node_work_is_placed(shop, team):
    racks(shop.accelerator, 2)
    gang, one = submit(shop, team, shop.gang), submit(shop, team, shop.one)
    result = cycle.run_cycle()
    gang.refresh_from_db()
    one.refresh_from_db()
    assert result.waiting == {gang.pk: backends.MULTI_NODE_BACKEND}
    assert gang.state == RequestState.QUEUED and one.state != RequestState.QUEUED
    assert gang.queue_reason["numbers"] == {"nodes": 2, "backends": ["container", "slurm"]}
    assert "no node here has a backend that runs multi-node work (container, slurm)" in gang.queue_reason["message"]
    assert not gang.allocations.exists()


def test_the_preview_of_a_gang_that_would_fit_says_it_waits_for_a_backend(shop, team):
    racks(shop.accelerator, 2)
    order = make_order(shop, team.project, spec=shop.gang)
    estimate = placement_estimate(order, size_order(order))
    assert (estimate["fits_now"], estimate["code"]) == (False, backends.MULTI_NODE_BACKEND)
    assert estimate["details"]["nodes"] == 2


def test_the_preview_of_a_gang_that_would_wait_gives_its_topology_numbers(shop, team):
    racks(shop.accelerator, 2, 2)
    for name in ("r1-n0", "r2-n0"):  # one free node left in each rack
        scheduling_services.node_cordon(node=Node.objects.get(name=name), reason="maintenance", actor=None)
    order = make_order(shop, team.project, spec=shop.gang)
    estimate = placement_estimate(order, size_order(order))
    assert estimate["code"] == "topology_constraint"
    assert estimate["details"]["best_free_nodes"] == 1 and estimate["details"]["free_nodes"] == 2
    assert "needs 2 free nodes × 4 H100 80GB in one rack; best rack r1 has 1" in estimate["message"]  # noqa: RUF001


def test_the_preview_api_counts_the_whole_gang_and_says_it_waits(shop, team, api_as):
    racks(shop.accelerator, 2)
    body = {
        "service": shop.service.pk,
        "project": team.project.pk,
        "spec": shop.gang.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
    }
    answer = api_as(team.developer).post("/api/v1/requests/preview/", body, format="json")
    assert answer.status_code == 200
    preview = answer.json()
    assert preview["placement"]["code"] == backends.MULTI_NODE_BACKEND
    assert Decimal(preview["cost"]["hourly"]) == Decimal(8)  # 4 cards x 2 nodes x 1.00


def test_a_gang_is_placed_on_slurm_nodes_only_one_allocation_per_member(shop, team):
    racks(shop.accelerator, 2)  # a whole free rack of simulated nodes, which cannot run one job over two nodes
    racks(shop.accelerator, 1, 2, backend="slurm")  # r2 (one node) and r3 (two)
    gang = submit(shop, team, shop.gang)
    result = cycle.run_cycle()
    gang.refresh_from_db()
    assert result.allocated == [gang.pk] and gang.state == RequestState.ALLOCATED
    members = list(gang.allocations.order_by("member").values_list("member", "node__name"))
    assert [member for member, _node in members] == [0, 1]
    assert {node for _member, node in members} == {"r3-n0", "r3-n1"}
    assert all(allocation.devices.count() == 4 for allocation in gang.allocations.all())
    event = gang.events.get(code="allocated")
    assert [member["member"] for member in event.data["members"]] == [0, 1]
    assert event.data["split"]["code"] == "gang_together"
    assert "as one gang" in event.message and "in one rack (r3)" in event.message


def test_a_gang_that_only_simulated_nodes_could_hold_waits_with_the_slurm_numbers(shop, team):
    racks(shop.accelerator, 2)
    racks(shop.accelerator, 1, 1, backend="slurm")  # two Slurm nodes, but in two racks
    gang = submit(shop, team, shop.gang)
    result = cycle.run_cycle()
    gang.refresh_from_db()
    assert result.waiting == {gang.pk: "no_matching_spec"} and not gang.allocations.exists()
    assert gang.queue_reason["numbers"]["largest"] == 1  # the whole free simulated rack is not counted


def test_ending_a_gang_releases_every_member_together(shop, team):
    racks(shop.accelerator, 2, backend="slurm")
    gang = submit(shop, team, shop.gang)
    cycle.run_cycle()
    ended = reclaim.allocation_free(request_ids=[gang.pk], reason="released by its owner")
    assert sorted(allocation.member for allocation in ended) == [0, 1]
    assert not Allocation.objects.filter(request=gang, state=AllocationState.ACTIVE).exists()
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_the_gang_leader_anchors_the_provisioning_run():
    anchor = str(Allocation.objects.filter(RUN_ANCHOR).query)
    assert '"member" = 0' in anchor and '"member" IS NULL' in anchor


def test_a_gangs_usage_is_metered_per_member_and_in_sum(shop, team):
    racks(shop.accelerator, 2, backend="slurm")
    gang = submit(shop, team, shop.gang)
    cycle.run_cycle()
    started = max(gang.allocations.values_list("started_at", flat=True))  # each member's, microseconds apart
    usage = request_usage(gang, now=started + timedelta(hours=2))
    assert [member["member"] for member in usage["members"]] == [0, 1]
    close = Decimal("0.001")
    assert all(abs(member["card_hours"] - 8) < close for member in usage["members"])  # 4 cards x 2 h each, not 8
    assert abs(usage["card_hours"] - 16) < close
    assert abs(usage["cost"] - sum(member["cost"] for member in usage["members"])) < close


def test_the_request_page_shows_every_member_node_of_a_gang(shop, team, client):
    racks(shop.accelerator, 2, backend="slurm")
    gang = submit(shop, team, shop.gang)
    cycle.run_cycle()
    details = allocation_details(gang)
    assert [member["member"] for member in details["members"]] == [0, 1]
    assert sorted(details["nodes"]) == ["r1-n0", "r1-n1"] and len(details["devices"]) == 8
    client.force_login(team.developer)
    page = client.get(reverse("portal:request-detail", args=[gang.pk])).content.decode()
    assert 'id="member-0"' in page and 'id="member-1"' in page
    assert all(f"<strong>{node}</strong>" in page for node in details["nodes"])


def test_a_gang_waiting_on_topology_says_when_its_best_rack_frees_the_nodes_it_lacks(shop, team):
    """One node of each rack runs 4-card work approved for 3 h: two nodes are free, never in one rack, so the gang
    waits with its rack's numbers and when the missing node frees there."""
    racks(shop.accelerator, 2, 2, backend="slurm")
    whole_node = factories.ResourceSpecFactory(accelerator_models=[shop.accelerator], accelerator_count=4, cpu_cores=8)
    shop.service.specs.add(whole_node)
    kept_free = [Node.objects.get(name=name) for name in ("r1-n1", "r2-n1")]
    for node in kept_free:  # the 4-card work goes on r1-n0 and r2-n0
        scheduling_services.node_cordon(node=node, reason="setting up", actor=None)
    for _ in range(2):
        order = make_order(shop, team.project, spec=whole_node, duration_hours=3)
        services.request_submit(order=order, requester=team.developer)
    cycle.run_cycle()
    for node in kept_free:
        scheduling_services.node_uncordon(node=node, reason="set up", actor=None)

    gang = submit(shop, team, shop.gang)
    result = cycle.run_cycle()
    gang.refresh_from_db()
    assert result.waiting == {gang.pk: "topology_constraint"}
    message, numbers = gang.queue_reason["message"], gang.queue_reason["numbers"]
    assert "best rack r1 has 1 (1 more frees in ~3 h; 2 such nodes are free in all)" in message
    freeing = Allocation.objects.get(node__name="r1-n0")
    assert (numbers["more_nodes"], numbers["more_free_at"]) == (1, freeing.expires_at.isoformat())

    order = make_order(shop, team.project, spec=shop.gang)
    estimate = placement_estimate(order, size_order(order))  # the preview says the same before submission
    assert estimate["code"] == "topology_constraint" and estimate["details"]["more_nodes"] == 1
    assert "best rack r1 has 1 (1 more frees in ~3 h;" in estimate["message"]


def test_the_usage_report_shows_a_gang_as_one_line_with_its_members_at_a_fixed_query_count(shop, team, api_as, client):
    """API, CSV and page: a multi-node request is one line (its card-hours in sum) with its members, each its node
    and its own figures; one more gang costs no more queries."""
    racks(shop.accelerator, 2, 2, backend="slurm")
    first = submit(shop, team, shop.gang)
    cycle.run_cycle()
    api = api_as(team.developer)
    client.force_login(team.developer)
    api.get("/api/v1/usage/")  # what a process reads once
    client.get(reverse("metering:usage"))
    with CaptureQueriesContext(connection) as one_gang:
        api.get("/api/v1/usage/", {"group_by": "request"})
    with CaptureQueriesContext(connection) as page_of_one:
        client.get(reverse("metering:usage"))
    others = [submit(shop, team, shop.gang)]  # the project's quota holds two
    cycle.run_cycle()
    with CaptureQueriesContext(connection) as two_gangs:
        lines = api.get("/api/v1/usage/", {"group_by": "request"}).json()["results"]
    with CaptureQueriesContext(connection) as page_of_two:
        page = client.get(reverse("metering:usage")).content.decode()
    assert (len(two_gangs), len(page_of_two)) == (len(one_gang), len(page_of_one))
    assert [line["request"] for line in lines] == sorted(request.pk for request in [first, *others])
    line = next(line for line in lines if line["request"] == first.pk)
    members = list(first.allocations.order_by("member").values_list("member", "node__name"))
    assert line["nodes"] == 2
    assert [(member["member"], member["node"]) for member in line["members"]] == members
    in_sum = sum(Decimal(member["card_hours"]) for member in line["members"])
    assert abs(in_sum - Decimal(line["card_hours"])) <= Decimal("0.0001") * len(members)  # each rounded on its own

    export = api.get("/api/v1/usage/export/", {"group_by": "request"}).content.decode().splitlines()
    assert export[0] == "request,card_hours,cost,currency,energy_kwh,nodes,members"
    assert any(
        row.startswith(f"{first.pk},") and row.endswith(",2," + " ".join(f"{m}:{n}" for m, n in members))
        for row in export
    )

    assert f'id="multi-node-{first.pk}"' in page and all(f"{m}: {n} (" in page for m, n in members)


def test_a_crowded_out_gang_at_the_head_holds_all_its_nodes_and_only_work_ending_before_it_backfills(shop, team):
    """One node runs 4-card work for 3 h, the other 2-card work for 2 h: the gang (2 nodes x 4 cards) can start in
    3 h on both. Work behind it that would still run then stays off both nodes (not only its leader's); work that
    ends before runs now."""
    racks(shop.accelerator, 2, backend="slurm")
    specs = {
        cards: factories.ResourceSpecFactory(
            accelerator_models=[shop.accelerator], accelerator_count=cards, cpu_cores=8
        )
        for cards in (2, 4)
    }
    shop.service.specs.add(*specs.values())
    for cards, hours in ((4, 3), (2, 2)):
        order = make_order(shop, team.project, spec=specs[cards], duration_hours=hours)
        services.request_submit(order=order, requester=team.developer)
    cycle.run_cycle()

    gang = submit(shop, team, shop.gang)
    outlasting, ending_first = (
        services.request_submit(
            order=make_order(shop, team.project, spec=shop.one, duration_hours=hours), requester=team.developer
        )
        for hours in (10, 1)
    )
    result = cycle.run_cycle()

    assert result.waiting[gang.pk] in {"capacity_in_use", "topology_constraint"}
    assert result.waiting[outlasting.pk] == "higher_priority_ahead"
    assert ending_first.pk in result.allocated
    outlasting.refresh_from_db()
    assert outlasting.queue_reason["numbers"]["reserved_for"] == str(gang.pk)


def test_a_gang_never_mixes_slurm_and_container_nodes_and_the_reason_says_so(shop, team):
    """One rack of a Slurm node and a container node, both free and both able to run multi-node work: the 2-node gang
    cannot run there as one job, so it never fits this inventory (the reason counts per backend); a second container
    node in the rack lets it run, on the two container nodes."""
    racks(shop.accelerator, 1, backend="slurm")
    rack = Rack.objects.get(name="r1")
    add_node(shop.accelerator, "r1-c0", rack, backend="container")
    gang = submit(shop, team, shop.gang)
    result = cycle.run_cycle()
    gang.refresh_from_db()
    assert result.waiting == {gang.pk: "no_matching_spec"} and not gang.allocations.exists()
    numbers = {"nodes": 2, "level": "rack", "largest": 1, "domain": "r1", "backend": "container"}
    assert gang.queue_reason["numbers"] == numbers
    assert "no rack of one backend has 2 nodes" in gang.queue_reason["message"]
    assert "though r1 has 2 over 2 backends (a gang runs on one)" in gang.queue_reason["message"]

    add_node(shop.accelerator, "r1-c1", rack, backend="container")
    result = cycle.run_cycle()
    assert result.allocated == [gang.pk]
    assert set(gang.allocations.values_list("node__name", flat=True)) == {"r1-c0", "r1-c1"}


# --- a gang's preemption, inside one domain ----------------------------------------------------------------------


@pytest.fixture
def entitled(db):
    """A team an operator entitled to critical work, with room in its quota for a gang and three whole nodes."""
    quota = {**GENEROUS_QUOTA, "gpus": Decimal(64), "accelerator_memory_gb": 64 * 80, "concurrent_tasks": 100}
    project = factories.project(quota=quota, max_priority=PriorityClass.CRITICAL)
    return SimpleNamespace(project=project, developer=factories.member(project))


def run_on(shop, team, name: str, priority: str) -> ResourceRequest:
    """A whole-node (4-card) request of `priority` running on node `name`: every other open node cordoned while the
    cycle places it."""
    spec = shop.service.specs.filter(node_count=1, accelerator_count=4).first()
    if spec is None:
        spec = factories.ResourceSpecFactory(accelerator_models=[shop.accelerator], accelerator_count=4, cpu_cores=8)
        shop.service.specs.add(spec)
    others = list(Node.objects.filter(schedulable=True).exclude(name=name))
    for node in others:
        scheduling_services.node_cordon(node=node, reason="placing a test workload", actor=None)
    request = services.request_submit(
        order=make_order(shop, team.project, spec=spec, priority=priority), requester=team.developer
    )
    assert cycle.run_cycle().allocated == [request.pk]
    for node in others:
        scheduling_services.node_uncordon(node=node, reason="placed", actor=None)
    return request


def test_a_critical_gang_preempts_inside_the_cheaper_rack_only_and_runs_there(shop, entitled):
    """r1 has a free node and one batch node, r2 two batch nodes: freeing r1 takes one victim, r2 two. The gang's
    victim is r1's only (never one of r2's, which together with r1's free node would make two free nodes across
    racks); its reason names the rack, the node freed and the victim; after the grace period it runs in r1."""
    racks(shop.accelerator, 2, 2, backend="slurm")
    victim = run_on(shop, entitled, "r1-n0", PriorityClass.BATCH)
    spared = [run_on(shop, entitled, name, PriorityClass.BATCH) for name in ("r2-n0", "r2-n1")]
    start = timezone.now()
    gang = services.request_submit(
        order=make_order(shop, entitled.project, spec=shop.gang, priority=PriorityClass.CRITICAL),
        requester=entitled.developer,
    )
    with time_machine.travel(start, tick=False):
        result = cycle.run_cycle()
    assert result.waiting[gang.pk] == PREEMPTION_PENDING
    assert dict(Allocation.objects.filter(preempt_at__isnull=False).values_list("request_id", "preempted_for_id")) == {
        victim.pk: gang.pk
    }
    gang.refresh_from_db()
    preempt_at = start + timedelta(seconds=300)
    assert gang.queue_reason["numbers"] == {
        "victims": [victim.pk],
        "preempt_at": preempt_at.isoformat(),
        "level": "rack",
        "domain": "r1",
        "nodes": ["r1-n0"],
    }
    assert f"Waiting for preemption of #{victim.pk} in rack r1 (freeing r1-n0) at" in gang.queue_reason["message"]
    note = victim.events.get(code=EventCode.PREEMPTION_SCHEDULED)
    assert (note.data["domain"], note.data["nodes"]) == ("r1", ["r1-n0"])

    with time_machine.travel(start + timedelta(seconds=60), tick=False):  # still in the grace period: same reason
        assert cycle.run_cycle().waiting[gang.pk] == PREEMPTION_PENDING
    assert gang.events.filter(code=EventCode.QUEUE_REASON).count() == 1

    with time_machine.travel(start + timedelta(seconds=301), tick=False):
        result = cycle.run_cycle()
    assert result.preempted == [victim.pk] and result.allocated == [gang.pk]
    assert set(gang.allocations.values_list("node__name", flat=True)) == {"r1-n0", "r1-n1"}
    assert all(ResourceRequest.objects.get(pk=r.pk).state == RequestState.ALLOCATED for r in spared)


def test_a_gang_plans_no_victims_when_no_rack_can_be_freed_and_says_so(shop, entitled):
    """A high gang may evict batch work only. r1: a free node and standard work; r2: batch and standard work. Evicting
    r2's batch work would give two free nodes, but in two racks: nobody is planned and the reason says why."""
    racks(shop.accelerator, 2, 2, backend="slurm")
    run_on(shop, entitled, "r1-n0", PriorityClass.STANDARD)
    run_on(shop, entitled, "r2-n0", PriorityClass.BATCH)
    run_on(shop, entitled, "r2-n1", PriorityClass.STANDARD)
    gang = services.request_submit(
        order=make_order(shop, entitled.project, spec=shop.gang, priority=PriorityClass.HIGH),
        requester=entitled.developer,
    )
    result = cycle.run_cycle()
    assert result.waiting[gang.pk] == "capacity_in_use"
    assert not Allocation.objects.filter(preempt_at__isnull=False).exists()
    gang.refresh_from_db()
    assert gang.queue_reason["message"].endswith(
        "; no rack could hold all 2 nodes even after preempting every lower-priority allocation it may evict; "
        "the best, r1, could offer 1"
    )
    assert gang.queue_reason["numbers"]["preemption"] == {"level": "rack", "best_domain": "r1", "reachable": 1}


def test_the_preview_keeps_a_gang_on_one_backend_as_the_cycle_does(shop, team):
    """Rack r1 has two Slurm and two container nodes, one of each cordoned: the two free nodes are of two backends,
    so the gang waits, and the preview (from the outcome the cycle stored, which keeps each node's backend) says the
    same with the numbers per backend."""
    racks(shop.accelerator, 2, backend="slurm")
    rack = Rack.objects.get(name="r1")
    for name in ("r1-c0", "r1-c1"):
        add_node(shop.accelerator, name, rack, backend="container")
    for name in ("r1-n1", "r1-c1"):
        scheduling_services.node_cordon(node=Node.objects.get(name=name), reason="maintenance", actor=None)
    gang = submit(shop, team, shop.gang)
    assert cycle.run_cycle().waiting == {gang.pk: "topology_constraint"}
    gang.refresh_from_db()
    expected = (
        "in one rack of one backend; best rack r1 (container) has 1 "
        "(2 such nodes are free in all: container 1, slurm 1)"
    )
    assert expected in gang.queue_reason["message"]
    assert gang.queue_reason["numbers"]["free_by_backend"] == {"container": 1, "slurm": 1}

    order = make_order(shop, team.project, spec=shop.gang)
    estimate = placement_estimate(order, size_order(order))
    assert estimate["code"] == "topology_constraint" and expected in estimate["message"]
