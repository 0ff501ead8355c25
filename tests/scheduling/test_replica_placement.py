"""The placement engine and a serving deployment's replicas: a gang (all of them or none, in one call), spread over
distinct nodes while any has room, sharing evenly (with a note) when too few have (soft anti-affinity). Pure: no
database."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import (
    CAPACITY_IN_USE,
    HIGHER_PRIORITY_AHEAD,
    NO_MATCHING_SPEC,
    REPLICAS_SHARE_NODE,
    Demand,
    DeviceView,
    NodeView,
    PlacementEngine,
    RunningAllocation,
    Snapshot,
    spread_note,
)
from scheduling.engine.policies import POLICIES

H100 = frozenset({"h100"})


def node(name: str, cards: int = 2, cpu_cores: int = 32, memory_gib: int = 256, **fields) -> NodeView:
    devices = tuple(DeviceView(index, "h100") for index in range(cards))
    return NodeView(name, cpu_cores * 1000, memory_gib * 1024, devices, **fields)


def replicated(replicas: int = 3, demand_id: str = "7", **fields) -> Demand:
    return Demand(demand_id, count=1, models=H100, cpu_milli=4000, memory_mib=16384, replicas=replicas, **fields)


def state(engine: PlacementEngine) -> tuple:
    return engine.free, engine.cpu, engine.mem


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_replicas_go_to_distinct_nodes_even_where_one_node_could_hold_them_all(policy):
    """Packing policies would put all three on the big node; anti-affinity spreads them over three."""
    engine = PlacementEngine(Snapshot([node("big", cards=8), node("a"), node("b")]), policy)
    result = engine.place([replicated(3)])
    assert result.pending == []
    assert sorted(binding.replica for binding in result.bindings) == [0, 1, 2]
    assert sorted(binding.node for binding in result.bindings) == ["a", "b", "big"]
    assert all(len(binding.devices) == 1 and binding.cpu_milli == 4000 for binding in result.bindings)
    assert spread_note(result.bindings) is None


def test_a_demand_without_replicas_is_placed_as_before():
    bindings = PlacementEngine(Snapshot([node("a", cards=4)])).place_one(Demand("1", count=2, models=H100))
    assert [(binding.node, binding.replica, len(binding.devices)) for binding in bindings] == [("a", None, 2)]


def test_when_only_one_node_fits_the_replicas_share_it_and_say_so():
    snapshot = Snapshot([node("gpu", cards=4), node("cpu-only", cards=0), node("cordoned", schedulable=False)])
    bindings = PlacementEngine(snapshot).place_one(replicated(3))
    assert [binding.node for binding in bindings] == ["gpu"] * 3
    assert len({device for binding in bindings for device in binding.devices}) == 3  # three different cards
    note = spread_note(bindings)
    assert note["code"] == REPLICAS_SHARE_NODE
    assert note["numbers"] == {"replicas": 3, "nodes": 1, "shared": {"gpu": [0, 1, 2]}}
    assert note["message"].startswith("3 replicas on 1 node: no other node had room")
    assert "One node failing can take 3 of the 3 replicas down." in note["message"]


def test_sharing_is_even_when_there_are_fewer_nodes_than_replicas():
    bindings = PlacementEngine(Snapshot([node("a", cards=4), node("b", cards=4)])).place_one(replicated(4))
    per_node = {name: [b.replica for b in bindings if b.node == name] for name in ("a", "b")}
    assert sorted(len(replicas) for replicas in per_node.values()) == [2, 2]
    assert spread_note(bindings)["numbers"]["shared"] == {name: sorted(r) for name, r in per_node.items()}


def test_a_node_without_room_for_a_replica_is_passed_over_for_a_shared_one():
    """`small` has a card but not the CPU a replica needs: two replicas share `a` rather than wait."""
    bindings = PlacementEngine(Snapshot([node("a", cards=2), node("small", cards=2, cpu_cores=2)])).place_one(
        replicated(2)
    )
    assert [binding.node for binding in bindings] == ["a", "a"]


def test_the_gang_is_all_or_nothing_and_gives_back_what_it_tried():
    engine = PlacementEngine(Snapshot([node("a", cards=1), node("b", cards=1)]))
    before = state(engine)
    pending = engine.place_one(replicated(3))
    assert pending.reason == CAPACITY_IN_USE
    assert pending.numbers == {"replicas": 3, "replicas_fitting": 2, "nodes": ["a", "b"]}
    assert "needs 3 replicas of 1×h100 with 4 CPU cores and 16 GiB memory each" in pending.message  # noqa: RUF001
    assert "only 2 fit now" in pending.message
    assert state(engine) == before
    assert len(engine.place_one(replicated(2, demand_id="8"))) == 2  # the room is still there for a smaller gang


def test_a_gang_that_does_not_fit_holds_lower_priority_work_back_like_any_demand():
    engine = PlacementEngine(Snapshot([node("a", cards=1), node("b", cards=1)]))
    result = engine.place([replicated(3, priority=3), Demand("9", count=1, models=H100, priority=1)])
    reasons = {pending.demand_id: pending.reason for pending in result.pending}
    assert reasons == {"7": CAPACITY_IN_USE, "9": HIGHER_PRIORITY_AHEAD}
    assert result.bindings == []


def test_no_replica_fitting_anywhere_is_explained_in_one_replica_s_words():
    pending = PlacementEngine(Snapshot([node("cpu", cards=0)])).place_one(replicated(3))
    assert pending.reason == NO_MATCHING_SPEC
    assert pending.message == "each of its 3 replicas needs 1×h100; no h100 device exists in the cluster"  # noqa: RUF001
    assert pending.numbers["replicas"] == 3 and pending.numbers["replicas_fitting"] == 0


def test_fits_tries_the_whole_gang_and_changes_nothing():
    engine = PlacementEngine(Snapshot([node("a", cards=1), node("b", cards=1)]))
    before = state(engine)
    assert engine.fits(replicated(2)) and not engine.fits(replicated(3))
    assert state(engine) == before


def test_replicas_of_one_request_running_on_several_nodes_are_each_a_preemption_candidate():
    """Engine allocation ids repeat for a replicated request (its replicas share the request's id): each replica
    counts on its own node, so evicting the request frees room on either."""
    running = [
        RunningAllocation("7", name, ((0, 1000), (1, 1000)), 8000, 32768, priority=1, preemptible=True)
        for name in ("a", "b")
    ]
    engine = PlacementEngine(Snapshot([node("a"), node("b")], running))
    plan = engine.plan_preemption(Demand("9", count=2, models=H100, priority=3))
    assert plan.feasible and plan.victims == ("7",)


def test_a_replicated_demand_is_not_planned_for_preemption():
    running = [RunningAllocation("5", "a", ((0, 1000), (1, 1000)), 0, 0, priority=1, preemptible=True)]
    plan = PlacementEngine(Snapshot([node("a")], running)).plan_preemption(replicated(2, priority=3))
    assert not plan.feasible and plan.victims == ()
    assert "preemption is not planned for replicated demands" in plan.message


def test_colocated_is_the_whole_deployment_as_one_demand():
    together = replicated(3).colocated
    assert (together.count, together.cpu_milli, together.memory_mib, together.replicas) == (3, 12000, 49152, 1)


# --- properties on random clusters -----------------------------------------------------------------------------


@st.composite
def clusters(draw):
    nodes = [
        node(f"n{n}", cards=draw(st.integers(0, 4)), cpu_cores=draw(st.sampled_from([2, 8, 32])))
        for n in range(draw(st.integers(1, 6)))
    ]
    held = [
        RunningAllocation(f"r{n}", nodes[n].name, ((0, 1000),), 1000, 1024)
        for n in range(len(nodes))
        if nodes[n].devices and draw(st.booleans())
    ]
    return Snapshot(nodes, held)


def nodes_with_room(snapshot: Snapshot, demand: Demand) -> set[str]:
    """The nodes that could each take one replica now, asked node by node."""
    room = set()
    for candidate in snapshot.nodes:
        alone = Snapshot(snapshot.nodes, [*snapshot.allocations])
        engine = PlacementEngine(alone)
        for other in snapshot.nodes:
            if other.name != candidate.name:
                engine.close_node(other.name)
        if engine.fits(demand.replica):
            room.add(candidate.name)
    return room


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.integers(2, 5), st.sampled_from(sorted(POLICIES)))
def test_gangs_are_whole_spread_as_far_as_room_allows_and_never_overcommit(snapshot, replicas, policy):
    demand = replicated(replicas)
    engine = PlacementEngine(snapshot, policy)
    before = state(engine)
    outcome = engine.place_one(demand)
    room = nodes_with_room(snapshot, demand)
    if isinstance(outcome, list):
        assert sorted(binding.replica for binding in outcome) == list(range(replicas))
        assert len({binding.node for binding in outcome}) == min(replicas, len(room))
        assert {binding.node for binding in outcome} <= room
        assert all(free >= 0 for devices in engine.free for free in devices)
        assert min(engine.cpu) >= 0 and min(engine.mem) >= 0
        counts = [sum(b.node == name for b in outcome) for name in {b.node for b in outcome}]
        assert (spread_note(outcome) is None) == (max(counts) == 1)
    else:
        assert state(engine) == before
        assert len(room) < replicas  # with room on as many nodes as replicas it would have fitted
    assert replace(demand, replicas=1) == demand.replica
