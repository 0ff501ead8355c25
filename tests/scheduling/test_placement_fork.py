"""Forks of a placement engine (what the order preview places on): the same answers as an engine built afresh, and
the engine they came from left as it was."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import Demand, DeviceView, NodeView, PlacementEngine, RunningAllocation, Snapshot
from scheduling.engine.policies import POLICIES, make_policy
from tests.scheduling.test_placement_properties import clusters, demands

FORK_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def running(snapshot: Snapshot, demand_list: list[Demand]) -> Snapshot:
    """The snapshot with the demands that fit running on it (the state a cycle leaves)."""
    bindings = PlacementEngine(snapshot, workload=demand_list).place(demand_list).bindings
    held = [RunningAllocation(b.demand_id, b.node, b.devices, b.cpu_milli, b.memory_mib) for b in bindings]
    return Snapshot(snapshot.nodes, held)


def no_policy_engine(snapshot: Snapshot) -> PlacementEngine:
    """The state alone, as the preview keeps it per cycle outcome: each fork brings the policy it places by."""
    return PlacementEngine(snapshot, policy=make_policy("default", ()))


@FORK_SETTINGS
@given(clusters(), demands(), demands(), st.sampled_from(sorted(POLICIES)))
def test_a_fork_places_as_a_fresh_engine_would(snapshot, earlier, later, policy):
    state = running(snapshot, earlier)
    order = later[-1]
    fresh = PlacementEngine(state, policy, workload=[order]).place(later)
    tuned = no_policy_engine(state).fork(workload=[order], policy=policy)
    assert tuned.fork().place(later) == fresh
    assert tuned.fork().place(later) == fresh  # the first fork's placements left the state as it was


@FORK_SETTINGS
@given(clusters(), demands(), demands(), demands(), st.sampled_from(sorted(POLICIES)))
def test_a_fork_of_the_start_state_holding_bindings_answers_as_an_engine_built_over_them(
    snapshot, earlier, placed, later, policy
):
    """What the cycle's head-of-line reservation and preemption planning work on (`CycleEngine.at_start`): the
    engine the cycle started from, forked before it placed, plus the cycle's bindings held as running work."""
    state = running(snapshot, earlier)
    workload = [*placed, *later]
    start = PlacementEngine(state, policy, workload=workload)
    start.fork().place(later)  # the cycle's own placing (shape indexes built on the start state) leaves it as it was
    bindings = start.fork().place(placed).bindings
    held = [RunningAllocation(b.demand_id, b.node, b.devices, b.cpu_milli, b.memory_mib) for b in bindings]
    fork = start.fork()
    fork.hold(held)
    built = PlacementEngine(Snapshot(state.nodes, [*state.allocations, *held]), policy, workload=workload)
    assert fork.allocations == built.allocations
    assert [fork.fits(demand) for demand in later] == [built.fits(demand) for demand in later]
    assert fork.place(later) == built.place(later)


@FORK_SETTINGS
@given(clusters(), demands(), demands(), st.data())
def test_closing_a_node_places_as_if_it_were_cordoned(snapshot, earlier, later, data):
    state = running(snapshot, earlier)
    closed = data.draw(st.sampled_from([node.name for node in state.nodes]))
    cordoned = Snapshot(
        [replace(n, schedulable=n.schedulable and n.name != closed) for n in state.nodes], state.allocations
    )
    order = later[-1]
    fork = no_policy_engine(state).fork(workload=[order]).fork()
    fork.close_node(closed)
    assert fork.place(later) == PlacementEngine(cordoned, workload=[order]).place(later)


def test_the_engine_a_fork_came_from_stays_as_it_was():
    nodes = [NodeView(f"n{i}", 32000, 262144, tuple(DeviceView(j, "H100") for j in range(4))) for i in range(3)]
    origin = no_policy_engine(Snapshot(nodes))
    before = (list(origin.cpu), list(origin.mem), [list(free) for free in origin.free], list(origin.state))
    whole_node = Demand("big", count=4, cpu_milli=8000)
    fork = origin.fork(workload=[whole_node]).fork()
    placed = [fork.place_one(replace(whole_node, id=f"big-{k}"))[0].node for k in range(3)]
    fork.close_node("n0")
    assert sorted(placed) == ["n0", "n1", "n2"] and not fork.fits(whole_node)  # the fork is full
    assert (origin.cpu, origin.mem, origin.free, origin.state) == before
    with pytest.raises(RuntimeError, match="frozen"):
        origin.place_one(whole_node)
