"""Benchmark fleets and trace workloads (bench.fleet, bench.scale) and the costs that must not grow with
them: a cycle's queries with the queue, the engine's topology reason with the fleet, provisioning enqueues with
what a cycle placed."""

import random

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import fleet, scale
from provisioning import wiring
from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling import cycle, reason_words
from scheduling.engine import HEALTHY, Demand, DeviceView, NodeView, PlacementEngine, Snapshot
from scheduling.models import Node
from tenancy.models import ProjectQuota

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,G2\nn1,32000,131072,2,T4\nn2,96000,786432,8,V100M32\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
    "p0,4000,16384,1,1000,,LS,Running,0,600,0\n"
    "p1,2000,8192,1,460,,BE,Running,0,600,0\n"
    "p2,16000,65536,2,1000,T4,LS,Running,0,90000,10\n"
    "p3,8000,32768,4,1000,G2|V100M32,BE,Running,0,900,0\n"
    "p4,0,1024,0,0,,LS,Running,0,100,0\n"
)


@pytest.fixture
def trace(tmp_path):
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_replicate_gives_distinct_names_sites_and_topology_domains(trace):
    rows = fleet.read_openb_nodes(trace[0])
    replicated = fleet.replicate(rows, 4)
    assert len(replicated) == 12 and len({node.name for node in replicated}) == 12
    assert {node.site for node in replicated} == {"site-00", "site-01", "site-02", "site-03"}
    assert all(node.topology_domain.startswith(node.site + "/pod-") for node in replicated)
    assert sum(node.gpus for node in replicated) == 4 * 18


def test_pod_shapes_are_catalog_sizes_and_the_mix_follows_qos(trace):
    shapes = fleet.read_pod_shapes(trace[1])
    assert len(shapes) == 4  # the CPU-only pod is left out
    share = next(shape for shape in shapes if shape.count == 1 and shape.milli < 1000)
    assert (share.milli, share.cpu_cores, share.memory_gb) == (500, 2, 8)  # 460 milli -> the next tenth
    assert next(shape for shape in shapes if shape.count == 2).models == ("T4",)
    drawn = fleet.draw_requests(shapes, 2000, projects=20, seed=3)
    by_qos = {(r.shape.qos, r.priority) for r in drawn}
    assert ("BE", "batch") in by_qos and not any(q == "LS" and p == "batch" for q, p in by_qos)
    assert {r.priority for r in drawn} == {"batch", "standard", "high", "critical"}
    owners = [r.project for r in drawn]
    assert owners.count(0) > owners.count(19)  # Zipf: the first project orders most
    assert all(1 <= r.duration_hours <= 720 for r in drawn)


@pytest.mark.django_db
def test_scaled_fleet_and_trace_workload_in_the_database(trace):
    inventory = scale.import_fleet(trace[0], 3)
    assert inventory == {"nodes": 9, "gpus": 54}
    assert Node.objects.filter(topology_domain__startswith="site-02/").count() == 3
    shapes = fleet.read_pod_shapes(trace[1])
    workload = scale.Workload(shapes, projects=20)
    ids = workload.queue(fleet.draw_requests(shapes, 50, projects=20, seed=1))
    assert ResourceRequest.objects.filter(pk__in=ids, state=RequestState.QUEUED).count() == 50
    tight = ProjectQuota.objects.get(project=workload.projects[9])
    assert tight.concurrent_tasks == fleet.MIX.tight_concurrent
    request = ResourceRequest.objects.filter(pk__in=ids, priority="batch").first()
    demand = cycle.demand_of(request)
    assert demand.preemptible and demand.models  # models resolved to catalog slugs
    assert request.approved_spec["project"] == request.project.slug


@pytest.mark.django_db
def test_cycle_queries_do_not_grow_with_the_trace_queue(trace):
    """Two queue sizes on two fresh copies of the fleet, each cycle placing some and leaving the rest waiting with
    reasons, priority classes, projects and concurrent-task limits in play: the same number of queries."""
    shapes = fleet.read_pod_shapes(trace[1])
    scale.import_fleet(trace[0], 2)
    workload = scale.Workload(shapes, projects=20)

    def measured(count, seed):
        workload.queue(fleet.draw_requests(shapes, count, projects=20, seed=seed))
        with CaptureQueriesContext(connection) as queries:
            result = cycle.run_cycle()
        assert result.allocated and result.waiting
        return len(queries)

    reason_words.named("")  # the catalog's names a process keeps: read by its first cycle, not by every cycle
    ContentType.objects.get_for_model(ResourceRequest)  # the audit rows' target type, which Django keeps likewise
    small = measured(120, 1)
    Node.objects.update(schedulable=True)
    scale.import_fleet(trace[0], 4)  # two more copies: room again for the second, longer queue
    large = measured(1200, 2)
    assert small == large


@pytest.mark.django_db
def test_start_runs_enqueues_at_most_a_bounded_number_of_tasks(monkeypatch):
    sent = []
    monkeypatch.setattr(wiring, "async_task", lambda name, ids: sent.append(ids))
    wiring.start_runs(request_ids=list(range(3)))
    assert sent == [[0, 1, 2]]  # fewer than a batch (PROVISIONING_START_BATCH): one task
    sent.clear()
    wiring.start_runs(request_ids=list(range(25)))
    assert sorted(map(len, sent)) == [5, 10, 10]  # a task per batch of ten
    sent.clear()
    wiring.start_runs(request_ids=list(range(10_000)))
    assert len(sent) == wiring.START_TASKS_PER_CYCLE
    assert sorted(i for ids in sent for i in ids) == list(range(10_000))


def _brute_largest_block(engine, models, share):
    best, where = 0, None
    for i, node in enumerate(engine.nodes):
        if not node.schedulable:
            continue
        block = sum(
            1
            for j, d in enumerate(node.devices)
            if d.model in models and d.health == HEALTHY and engine.free[i][j] >= share
        )
        if block > best or (block == best and where is not None and node.name < where):
            best, where = block, node.name
    return best, where


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_largest_block_kept_up_to_date_matches_a_full_scan(seed):
    rng = random.Random(seed)
    nodes = [
        NodeView(
            f"n{n:02d}",
            64000,
            262144,
            tuple(DeviceView(j, rng.choice(["A", "B"])) for j in range(rng.choice([1, 2, 4, 8]))),
        )
        for n in range(rng.randint(2, 12))
    ]
    engine = PlacementEngine(Snapshot(nodes), "fgd")
    placed = []
    for step in range(30):
        models = frozenset(rng.sample(["A", "B"], rng.randint(1, 2)))
        share = rng.choice([1000, 500, 250])
        assert engine.explainer.largest_block(Demand("q"), models, share) == _brute_largest_block(engine, models, share)
        if placed and rng.random() < 0.3:
            engine.release(placed.pop(rng.randrange(len(placed))))
        elif rng.random() < 0.1:
            engine.close_node(rng.choice(nodes).name)
        else:
            count = 1 if share < 1000 else rng.choice([1, 2])
            outcome = engine.place_one(Demand(f"d{step}", count=count, share=share, models=models, cpu_milli=1000))
            if isinstance(outcome, list):
                placed.extend(outcome)


@pytest.mark.django_db
def test_a_cycle_works_on_the_head_of_the_queue_order_only(trace, settings):
    """Bounded work per cycle: with a window of 30, the cycle places or explains exactly the first 30 requests in
    queue order (priority class first) and leaves the others as they were."""
    settings.SCHEDULER_CYCLE_WINDOW = 30
    shapes = fleet.read_pod_shapes(trace[1])
    scale.import_fleet(trace[0], 1)
    workload = scale.Workload(shapes, projects=20)
    workload.queue(fleet.draw_requests(shapes, 200, projects=20, seed=4))
    head = {request.pk for request in cycle.queue_order(list(ResourceRequest.objects.all()))[:30]}
    result = cycle.run_cycle()
    assert set(result.allocated) | set(result.waiting) == head
    assert not ResourceRequest.objects.exclude(pk__in=head).exclude(queue_reason={}).exists()


@pytest.mark.django_db
def test_steady_state_replay_releases_what_ended_and_reports_waits(trace):
    from bench import steady

    shapes = fleet.read_pod_shapes(trace[1])
    scale.import_fleet(trace[0], 3)
    workload = scale.Workload(shapes, projects=20)
    report = steady.run(workload, shapes, minutes=30, queued=40, interval_s=300, arrivals_per_minute=2, seed=5)
    assert report["cycles"] == 7

    assert report["allocated"] > 0 and report["departed"] > 0  # the trace's 10-minute pods leave
    assert report["wait_max_s"] >= report["wait_p99_s"] >= report["wait_p50_s"] >= 0
    assert ResourceRequest.objects.filter(state=RequestState.RELEASED).count() == report["departed"]
    assert all(row["queries"] > 0 for row in report["per_cycle"])
