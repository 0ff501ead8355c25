"""Crafted scenarios: one per pending reason code (code and numbers), preemption planning, device health."""

from scheduling.engine import (
    CAPACITY_IN_USE,
    DEGRADED,
    FRAGMENTATION,
    HIGHER_PRIORITY_AHEAD,
    INSUFFICIENT_HEALTHY_CAPACITY,
    ISOLATED,
    NO_MATCHING_SPEC,
    TOPOLOGY_CONSTRAINT,
    Demand,
    DeviceView,
    NodeView,
    PlacementEngine,
    RunningAllocation,
    Snapshot,
    place,
)

H100 = frozenset({"H100"})


def node(name, n, model="H100", health=None, cpu=128000, mem=1 << 20):
    health = health or {}
    devices = tuple(DeviceView(j, model, health=health.get(j, "healthy")) for j in range(n))
    return NodeView(name, cpu, mem, devices)


def pending_of(result, demand_id):
    return next(p for p in result.pending if p.demand_id == demand_id)


def test_no_matching_spec():
    result = place(Snapshot([node("a", 8, model="A100")]), [Demand("d", count=8, models=H100)])
    p = pending_of(result, "d")
    assert p.reason == NO_MATCHING_SPEC and p.numbers == {"needed": 8, "devices": 0}
    assert "no H100 device exists" in p.message


def test_insufficient_healthy_capacity():
    snapshot = Snapshot([node("a", 8, health={0: ISOLATED, 1: ISOLATED, 2: DEGRADED})])
    p = pending_of(place(snapshot, [Demand("d", count=8, models=H100)]), "d")
    assert p.reason == INSUFFICIENT_HEALTHY_CAPACITY
    assert p.numbers == {"needed": 8, "devices": 8, "healthy": 5}
    assert "8 exist but only 5 are healthy" in p.message


def test_capacity_in_use():
    snapshot = Snapshot([node("a", 4)], [RunningAllocation("x", "a", ((0, 1000), (1, 1000), (2, 1000)))])
    p = pending_of(place(snapshot, [Demand("d", count=2, models=H100)]), "d")
    assert p.reason == CAPACITY_IN_USE
    assert p.numbers == {"needed_milli": 2000, "free_milli": 1000, "healthy": 4}


def test_topology_constraint_states_largest_block():
    snapshot = Snapshot(
        [node("r12-n04", 8), node("r12-n05", 8)],
        [
            RunningAllocation("x", "r12-n04", ((0, 1000), (1, 1000))),
            RunningAllocation("y", "r12-n05", tuple((j, 1000) for j in range(6))),
        ],
    )
    p = pending_of(place(snapshot, [Demand("d", count=8, models=H100)]), "d")
    assert p.reason == TOPOLOGY_CONSTRAINT
    assert p.numbers == {"needed": 8, "free_devices": 8, "largest_block": 6, "largest_block_node": "r12-n04"}
    assert "needs 8×H100 on one node" in p.message  # noqa: RUF001 and "largest free block is 6 on node r12-n04" in p.message


def test_fragmentation():
    snapshot = Snapshot(
        [node("a", 2), node("b", 2)],
        [RunningAllocation("x", "a", ((0, 600), (1, 600))), RunningAllocation("y", "b", ((0, 600), (1, 1000)))],
    )
    p = pending_of(place(snapshot, [Demand("d", share=500, models=H100)]), "d")
    assert p.reason == FRAGMENTATION
    assert p.numbers == {"needed_milli": 500, "free_milli": 1200, "fitting_devices": 0}


def test_higher_priority_ahead():
    snapshot = Snapshot([node("a", 8)], [RunningAllocation("x", "a", ((0, 1000), (1, 1000), (2, 1000), (3, 1000)))])
    big = Demand("big", count=8, models=H100, priority=10)  # fits the node once x ends
    small = Demand("small", count=1, models=H100, priority=1)
    result = place(snapshot, [big, small])
    assert pending_of(result, "big").reason == CAPACITY_IN_USE
    p = pending_of(result, "small")
    assert p.reason == HIGHER_PRIORITY_AHEAD
    assert p.numbers == {"blocked_by": "big", "blocker_priority": 10, "priority": 1}
    assert [b.demand_id for b in place(snapshot, [big, small], backfill=True).bindings] == ["small"]


def test_degraded_devices_are_not_used():
    snapshot = Snapshot([node("a", 2, health={0: DEGRADED}), node("b", 1)])
    result = place(snapshot, [Demand(f"d{k}", models=H100) for k in range(3)])
    assert sorted((b.node, b.devices) for b in result.bindings) == [("a", ((1, 1000),)), ("b", ((0, 1000),))]
    assert pending_of(result, "d2").reason == CAPACITY_IN_USE


def test_isolated_never_used():
    snapshot = Snapshot([node("a", 2, health={0: ISOLATED})])
    result = place(snapshot, [Demand("d1", models=H100), Demand("d2")])
    assert [b.devices for b in result.bindings] == [((1, 1000),)]


def test_slice_profiles_use_the_profile_share():
    mig = DeviceView(0, "A100", slice_profiles={"3g.40gb": 428, "1g.10gb": 142})
    snapshot = Snapshot([NodeView("a", 64000, 1 << 19, (mig,))])
    result = place(snapshot, [Demand(f"s{k}", slice_profile="3g.40gb") for k in range(3)])
    assert [b.devices for b in result.bindings] == [((0, 428),), ((0, 428),)]
    p = pending_of(result, "s2")
    assert p.reason == CAPACITY_IN_USE and p.numbers == {"needed_milli": 428, "free_milli": 144, "healthy": 1}


def _busy_node():
    return Snapshot(
        [node("a", 4), node("b", 4)],
        [
            RunningAllocation("a-old-low", "a", ((0, 1000),), priority=1, preemptible=True, started_at=1),
            RunningAllocation("a-new-low", "a", ((1, 1000),), priority=1, preemptible=True, started_at=5),
            RunningAllocation("a-mid", "a", ((2, 1000), (3, 1000)), priority=3, preemptible=True, started_at=2),
            RunningAllocation("b-fixed", "b", ((0, 1000), (1, 1000)), priority=1, preemptible=False),
            RunningAllocation("b-low", "b", ((2, 1000),), priority=2, preemptible=True, started_at=9),
            RunningAllocation("b-high", "b", ((3, 1000),), priority=9, preemptible=True, started_at=9),
        ],
    )


def test_preemption_picks_fewest_then_lowest_then_youngest():
    engine = PlacementEngine(_busy_node(), "bestfit")
    plan = engine.plan_preemption(Demand("one", count=1, priority=5))
    assert plan.feasible and plan.victims == ("a-new-low",) and plan.node == "a"
    plan = engine.plan_preemption(Demand("two", count=2, priority=5))
    assert plan.feasible and plan.node == "a" and plan.victims == ("a-mid",)  # one victim beats two
    plan = engine.plan_preemption(Demand("three", count=3, priority=5))
    assert plan.feasible and set(plan.victims) == {"a-mid", "a-new-low"}


def test_preemption_respects_priority_and_preemptible():
    engine = PlacementEngine(_busy_node(), "bestfit")
    assert not engine.plan_preemption(Demand("x", count=4, priority=1)).feasible
    plan = engine.plan_preemption(Demand("y", count=4, priority=10))
    assert plan.feasible and plan.node == "a" and len(plan.victims) == 3
    assert not engine.plan_preemption(Demand("z", count=5, priority=10)).feasible


# --- never fits ----------------------------------------------------------------------------------------------


def test_a_demand_no_node_could_hold_even_empty_says_which_dimension_blocks():
    """8x H100 with 128 vCPU on 112-core nodes: not capacity_in_use (it would wait for ever), but no_matching_spec."""
    nodes = [node(f"h100-{n}", 8, cpu=112000, mem=2048 * 1024) for n in (1, 2)]
    p = pending_of(place(Snapshot(nodes), [Demand("d", count=8, models=H100, cpu_milli=128000)]), "d")
    assert p.reason == NO_MATCHING_SPEC
    assert p.numbers == {"dimension": "cpu_cores", "needed": 128, "largest": 112, "node": "h100-1"}
    assert "no node has 128 cores: the largest H100 node has 112" in p.message


def test_never_fits_checks_devices_then_cores_then_memory_on_one_node():
    small = node("small", 4, cpu=256000, mem=4096 * 1024)
    big = node("big", 8, cpu=64000, mem=512 * 1024)
    cases = [  # (demand, blocking dimension, what is needed, the largest node that has it)
        (Demand("d", count=16, models=H100), ("devices", 16, 8, "big")),
        (Demand("d", count=8, models=H100, cpu_milli=96000), ("cpu_cores", 96, 64, "big")),
        (Demand("d", count=8, models=H100, cpu_milli=32000, memory_mib=1024 * 1024), ("memory_gib", 1024, 512, "big")),
        (Demand("d", count=1, slice_profile="1g.10gb", models=H100), ("devices", 1, 0, "small")),
    ]
    for demand, (dimension, needed, largest, where) in cases:
        p = pending_of(place(Snapshot([small, big]), [demand]), "d")
        assert (p.reason, p.numbers) == (
            NO_MATCHING_SPEC,
            {"dimension": dimension, "needed": needed, "largest": largest, "node": where},
        ), demand


def test_hardware_that_could_come_back_is_not_never_fits():
    """A cordoned node and isolated cards exist: the demand waits for them, it is not refused as never fitting."""
    cordoned = NodeView("cordoned", 128000, 1 << 20, tuple(DeviceView(j, "H100") for j in range(8)), schedulable=False)
    isolated = node("isolated", 8, health=dict.fromkeys(range(8), ISOLATED))
    demand = Demand("d", count=8, models=H100, cpu_milli=96000)
    for snapshot in (Snapshot([cordoned]), Snapshot([isolated])):
        p = pending_of(place(snapshot, [demand]), "d")
        assert p.reason == INSUFFICIENT_HEALTHY_CAPACITY, p


def test_a_demand_that_never_fits_holds_no_one_back():
    snapshot = Snapshot([node("a", 4)])
    result = place(snapshot, [Demand("huge", count=8, models=H100, priority=100), Demand("small", models=H100)])
    assert pending_of(result, "huge").reason == NO_MATCHING_SPEC
    assert [binding.demand_id for binding in result.bindings] == ["small"]
