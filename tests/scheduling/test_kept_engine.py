"""The placement engine a scheduler process keeps between cycles: advanced to a new snapshot it answers as an engine
built over that snapshot with the same policy, and after learning the policy again as one built with the new one;
the cycle keeps it while inventory, policy and the process's cluster state stay, and builds a new one otherwise."""

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling import cluster_state, kept_engine
from scheduling.choices import AllocationState
from scheduling.engine import Demand, DeviceView, NodeView, PlacementEngine, RunningAllocation, Snapshot
from scheduling.engine.policies import POLICIES, make_policy, shape_drift
from scheduling.models import Allocation as AllocationRow
from tests.scheduling.test_cluster_state import kept, release  # noqa: F401 - fixture
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401 - fixtures
from tests.scheduling.test_placement_fork import FORK_SETTINGS, running
from tests.scheduling.test_placement_properties import clusters, demands


def held(bindings) -> list[RunningAllocation]:
    return [RunningAllocation(b.demand_id, b.node, b.devices, b.cpu_milli, b.memory_mib) for b in bindings]


@FORK_SETTINGS
@given(clusters(), demands(), demands(), demands(), st.sampled_from(sorted(POLICIES)), st.randoms())
def test_an_advanced_engine_answers_as_one_built_over_the_new_snapshot(snapshot, earlier, started, later, policy, rng):
    state = running(snapshot, earlier)
    start = PlacementEngine(state, policy, workload=[*started, *later])
    start.fork().place(later)  # shape indexes scored on the old state, as the last cycle left them
    ended = [a for a in state.allocations if rng.random() < 0.5]
    now = [a for a in state.allocations if a not in ended] + held(start.fork().place(started).bindings)
    start.advance(now)
    built = PlacementEngine(Snapshot(state.nodes, now), start.policy)
    assert start.allocations == built.allocations
    assert [start.fork().fits(demand) for demand in later] == [built.fork().fits(demand) for demand in later]
    assert start.fork().place(later) == built.fork().place(later)


@FORK_SETTINGS
@given(
    clusters(sliced=True),
    demands(sliced=True),
    demands(sliced=True),
    demands(sliced=True),
    st.sampled_from(sorted(POLICIES)),
    st.randoms(),
)
def test_an_engine_that_learnt_its_policy_again_answers_as_one_built_with_it(
    snapshot, earlier, started, later, policy, rng
):
    """What a cycle does when the queue's shapes drifted: advance the kept engine, then learn the policy from the new
    window; its scores, device options and blocks kept from before must not leak into the new decisions."""
    state = running(snapshot, earlier)
    start = PlacementEngine(state, policy, workload=earlier)
    start.fork().place([*started, *later])  # shapes scored by the old policy, as the last cycle left them
    ended = [a for a in state.allocations if rng.random() < 0.5]
    now = [a for a in state.allocations if a not in ended] + held(start.fork().place(started).bindings)
    start.advance(now)
    start.relearn(later, policy)
    built = PlacementEngine(Snapshot(state.nodes, now), policy, workload=later)
    assert start.policy.table.shapes == built.policy.table.shapes
    assert [start.fork().fits(demand) for demand in started] == [built.fork().fits(demand) for demand in started]
    assert start.fork().place(later) == built.fork().place(later)
    assert start.fork().place(started) == built.fork().place(started)


def test_learning_again_scores_the_shapes_afresh():
    """fgd-plus keeps a model contested by the workload for the demands that need it: once the workload contests the
    other model, a demand for any card goes the other way, though its shape was scored before."""
    nodes = [NodeView("a", 8000, 65536, (DeviceView(0, "H100"),)), NodeView("b", 8000, 65536, (DeviceView(0, "A100"),))]
    engine = PlacementEngine(Snapshot(nodes), "fgd-plus", workload=[Demand("h", models=frozenset({"H100"}))])
    anyone = Demand("x")
    assert engine.fork().place([anyone]).bindings[0].node == "b"
    engine.relearn([Demand("a", models=frozenset({"A100"}))], "fgd-plus")
    assert engine.fork().place([anyone]).bindings[0].node == "a"


def test_learning_again_from_an_empty_queue_learns_from_the_running_work():
    """As an engine built with no workload does: what runs stands for recent demand."""
    nodes = fleet(3)
    engine = PlacementEngine(Snapshot(nodes), "fgd-plus", workload=[Demand("a", count=1)])
    running_now = held(engine.fork().place([Demand("b", count=2, cpu_milli=4000)]).bindings)
    engine.advance(running_now)
    engine.relearn([], "fgd-plus")
    assert engine.policy.table.shapes == PlacementEngine(Snapshot(nodes, running_now), "fgd-plus").policy.table.shapes


@pytest.mark.parametrize("policy", ["fgd", "fgd-plus"])
@pytest.mark.parametrize("seed", range(6))
def test_nodes_of_one_cpu_class_share_a_score_without_changing_a_decision(policy, seed):
    """FGD reads the free CPU only through the fragmentation's steps (the typical shapes' core counts), so nodes
    whose free CPU before and after placing falls in the same steps are scored once; an engine whose policy reads
    the exact amount decides the same. Nodes alike but for their cores, demands of a few core counts: the free CPU
    is what tells the nodes' scores apart here."""
    rng = random.Random(seed)
    nodes = [
        NodeView(f"n{i:02d}", rng.randint(1, 24) * 1000, 262144, tuple(DeviceView(j, "H100") for j in range(4)))
        for i in range(30)
    ]
    work = [
        Demand(
            f"d{k}",
            count=rng.choice([0, 1, 1, 2]),
            share=rng.choice([1000, 500]),
            cpu_milli=rng.choice([1, 2, 4, 8]) * 1000,
        )
        for k in range(60)
    ]
    work = [replace(d, share=1000) if d.count != 1 else d for d in work]
    classed, exact = (make_policy(policy, [(d.cpu_milli, 0, d.count, d.share, d.models) for d in work]) for _ in "ab")
    exact.cpu_class = None
    assert classed.cpu_class is not None
    assert PlacementEngine(Snapshot(nodes), classed).place(work) == PlacementEngine(Snapshot(nodes), exact).place(work)


def fleet(count: int) -> list[NodeView]:
    return [NodeView(f"n{i:02d}", 32000, 262144, tuple(DeviceView(j, "H100") for j in range(4))) for i in range(count)]


def test_the_change_list_stays_as_long_as_the_fleet_over_many_advances():
    rng = random.Random(7)
    shapes = [Demand(f"d{k}", count=rng.choice([1, 2]), cpu_milli=rng.choice([1000, 4000])) for k in range(40)]
    engine = PlacementEngine(Snapshot(fleet(8)), "fgd-plus", workload=shapes)
    now: list[RunningAllocation] = []
    for _cycle in range(30):
        now = [a for a in now if rng.random() < 0.6] + held(engine.fork().place(shapes).bindings)
        engine.advance(now)
        assert len(engine.changed) <= 2 * len(engine.nodes)
    built = PlacementEngine(Snapshot(engine.nodes, now), engine.policy)
    assert engine.fork().place(shapes) == built.place(shapes)


def test_a_frozen_engine_scores_each_shape_from_where_it_last_looked():
    """The cycle's start state refreshes each shape from the point of the change list it last looked at (the nodes
    changed since are grouped once per point): a shape seen last cycle sees what changed, a new one the whole fleet."""
    one, two = Demand("one", count=1), Demand("two", count=2)
    engine = PlacementEngine(Snapshot(fleet(4)), "fgd-plus", workload=[one, two])
    engine.fork().place([one])  # `one` scored on the empty fleet
    now = [RunningAllocation("x", "n01", ((0, 1000), (1, 1000), (2, 1000)))]
    engine.advance(now)
    built = PlacementEngine(Snapshot(fleet(4), now), engine.policy)
    assert engine.fork().place([one, two, two]) == built.place([one, two, two])


def test_a_fork_of_an_engine_that_advanced_refuses_a_shape_it_had_not_copied():
    engine = PlacementEngine(Snapshot(fleet(2)), "fgd-plus", workload=[Demand("a", count=1)])
    old = engine.fork()
    engine.advance([RunningAllocation("x", "n00", ((0, 1000),))])
    with pytest.raises(RuntimeError, match="advanced"):
        old.place([Demand("b", count=2)])
    assert engine.fork().place([Demand("b", count=4)]).bindings[0].node == "n01"  # n00 has a card in use now


def test_drift_is_half_the_moved_weight(settings):
    one, two = Demand("a", count=1), Demand("b", count=2)
    learnt = make_policy("fgd-plus", [(d.cpu_milli, d.memory_mib, d.count, d.share, d.models) for d in [one, two]])
    shapes = learnt.table.shapes
    assert shape_drift(shapes, shapes) == 0
    assert shape_drift(shapes, [shape._replace(weight=1.0) for shape in shapes[:1]]) == pytest.approx(0.5)


@pytest.fixture
def engines(monkeypatch):
    fresh = kept_engine.KeptEngine()
    monkeypatch.setattr(kept_engine, "kept", fresh)
    return fresh


def test_the_kept_engine_learns_again_on_drift_and_is_built_again_on_a_new_state_an_inventory_change_or_a_policy(
    engines, settings
):
    settings.SCHEDULER_POLICY_DRIFT = 0.05
    nodes, source = fleet(3), object()
    work = [Demand(f"d{k}", count=1) for k in range(20)]
    first = engines.engine_for(Snapshot(nodes), "default", work, source=source)
    running_now = held(first.fork().place(work[:3]).bindings)
    assert engines.engine_for(Snapshot(nodes, running_now), "default", work, source=source) is first
    assert engines.advances == 1 and first.allocations == running_now
    drifted = [*work[:19], Demand("big", count=2)]  # a twentieth of the demand moved: still within 0.05
    assert engines.engine_for(Snapshot(nodes, running_now), "default", drifted, source=source) is first
    assert (engines.advances, engines.relearns) == (2, 0)
    more = [*work[:17], *(Demand(f"b{k}", count=2) for k in range(3))]  # 15 % of the demand moved
    assert engines.engine_for(Snapshot(nodes, running_now), "default", more, source=source) is first
    assert (engines.builds, engines.relearns) == (1, 1)
    assert first.policy.table.shapes == PlacementEngine(Snapshot(nodes), "default", workload=more).policy.table.shapes
    for snapshot, policy, workload, state in [
        (Snapshot(nodes, running_now), "default", work, object()),  # the cluster was read whole again
        (Snapshot([*nodes[:2], replace(nodes[2], schedulable=False)], running_now), "default", work, source),
        (Snapshot(nodes, running_now), "bestfit", work, source),
    ]:
        base = engines.engine_for(Snapshot(nodes, running_now), "default", work, source=source)
        builds = engines.builds
        assert engines.engine_for(snapshot, policy, workload, source=state) is not base
        assert engines.builds == builds + 1


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_cycle_on_the_kept_engine_places_on_what_a_release_freed(shop, team, kept, engines):  # noqa: F811
    """Submissions run cycles after their commits: the first builds the engine, the later ones advance it by the
    allocations the change log names, so the freed cards are seen without scoring the fleet again."""
    add_node(shop.accelerator, "n1", cards=2)
    first = queued(shop, team)  # both cards
    second = queued(shop, team)  # waits: no card free
    release(first.pk)
    queued(shop, team)  # a cycle at the latest: the second takes the freed cards, the third waits
    second.refresh_from_db()
    assert second.state != "queued"
    assert AllocationRow.objects.filter(state=AllocationState.ACTIVE, request=second).exists()
    assert engines.builds == 1 and engines.advances >= 2, "one engine, advanced cycle after cycle"
    assert cluster_state.kept.rebuilds == 0
