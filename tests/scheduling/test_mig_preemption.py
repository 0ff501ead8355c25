"""Preemption for MIG slices on the pure engine: the victims chosen are the fewest (then lowest priorities, then
youngest) whose release leaves a valid placement of the profile, not just enough free memory slices; a whole card
emptied by its victim may change mode; and releasing the planned victims always lets the demand be placed."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.mig import (
    SEEDED,
    Card,
    Holding,
    Instance,
    MigBinding,
    MigEngine,
    MigNode,
    Placed,
    SliceDemand,
    layout_problems,
)

H100 = SEEDED["H100 80GB"]
THREE = SliceDemand("winner", profile="3g.40gb", models=frozenset({"H100 80GB"}), cpu_milli=1000)


def one_card(instances, *, pinned=False, mig=True, busy_milli=0, cpu=64_000) -> MigEngine:
    card = Card(0, "H100 80GB", H100, mig=mig, instances=tuple(instances), pinned=pinned, busy_milli=busy_milli)
    return MigEngine([MigNode("n1", cpu, 512 * 1024, (card,))])


def holder(name: str, instance: Instance, *, priority=10, started_at=0.0, cpu=1000) -> Holding:
    return Holding(name, "n1", (Placed(0, 142, instance),), cpu, 0, priority, started_at)


def ones(*starts) -> dict[int, Instance]:
    return {start: Instance("1g.10gb", start, 1, busy=True) for start in starts}


def release_and_place(engine: MigEngine, holdings, victims, demand=THREE):
    for holding in holdings:
        if holding.id in victims:
            engine.release(MigBinding(holding.id, holding.node, holding.placed, holding.cpu_milli, holding.memory_mib))
    return engine.place_one(demand)


def test_the_victims_free_a_valid_placement_not_just_enough_slices():
    """1g.10gb instances at 0, 1, 4, 5 and 6; slices 2, 3 and 7 free. Evicting the two youngest (5 and 6) would free
    five slices and four compute slices, yet neither 3g.40gb placement (starts 0 or 4, four slices): the plan
    evicts the two at 0 and 1 (start 0), the fewest that make a valid placement."""
    instances = ones(0, 1, 4, 5, 6)
    engine = one_card(instances.values())
    holdings = [
        holder("at0", instances[0], started_at=1),
        holder("at1", instances[1], started_at=2),
        holder("at4", instances[4], started_at=3),
        holder("at5", instances[5], started_at=9),
        holder("at6", instances[6], started_at=8),
    ]
    assert not engine.fits(THREE)
    plan = engine.plan_preemption(THREE, holdings)
    assert (plan.feasible, plan.node, sorted(plan.victims)) == (True, "n1", ["at0", "at1"])
    # with one of them not evictable (another tenant, a promised victim), the three at 4-6 make start 4
    plan = engine.plan_preemption(THREE, [h for h in holdings if h.id != "at1"])
    assert sorted(plan.victims) == ["at4", "at5", "at6"]
    binding = release_and_place(engine, holdings, plan.victims)
    assert binding.placed[0].instance.start == 4


def test_lower_priorities_and_then_the_youngest_go_first():
    instances = ones(0, 2, 4, 6)  # 1g.10gb at 0, 2, 4, 6: any two victims on one side free a 3g placement
    holdings = [
        holder("old0", instances[0], started_at=1),
        holder("young2", instances[2], started_at=5),
        holder("old4", instances[4], started_at=2, priority=5),
        holder("young6", instances[6], started_at=6, priority=5),
    ]
    plan = one_card(instances.values()).plan_preemption(THREE, holdings)
    assert sorted(plan.victims) == ["old4", "young6"]  # the lower class, though older


def test_a_whole_card_whose_work_is_evicted_may_change_mode():
    engine = one_card((), mig=False, busy_milli=1000)
    whole = Holding("whole", "n1", (Placed(0, 1000, None),), 4000, 0, 10, 0.0)
    plan = engine.plan_preemption(THREE, [whole])
    assert (plan.feasible, plan.victims) == (True, ("whole",))
    binding = release_and_place(engine, [whole], plan.victims)
    assert (binding.placed[0].mode, binding.placed[0].create) == ("mig", True)


def test_no_plan_when_no_victim_set_frees_a_valid_placement():
    """A pinned layout without a 3g.40gb instance: evicting its work frees instances, never a 3g."""
    instances = [Instance("2g.20gb", start, 2, busy=True) for start in (0, 2, 4)]
    engine = one_card(instances, pinned=True)
    holdings = [holder(f"at{i.start}", i) for i in instances]
    plan = engine.plan_preemption(THREE, holdings)
    assert (plan.feasible, plan.victims) == (False, ())
    assert "no set of preemptible work frees a valid placement" in plan.message


def test_cpu_counts_too():
    """No CPU left on the node: evicting the youngest two (at 0 and 1) frees start 0 but no CPU; the pair at 4 and 5,
    one of which holds the CPU, frees start 4 and the CPU."""
    instances = ones(0, 1, 4, 5)
    engine = one_card(instances.values(), cpu=0)
    holdings = [
        holder("at0", instances[0], cpu=0, started_at=9),
        holder("at1", instances[1], cpu=0, started_at=8),
        holder("at4", instances[4], cpu=0, started_at=1),
        holder("at5", instances[5], cpu=1000, started_at=2),
    ]
    plan = engine.plan_preemption(THREE, holdings)
    assert sorted(plan.victims) == ["at4", "at5"]


PROFILES = [p.name for p in H100.profiles if "+me" not in p.name]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.lists(st.sampled_from(PROFILES), max_size=7),
    wanted=st.sampled_from(PROFILES),
    seed=st.integers(0, 10_000),
)
def test_a_feasible_plan_always_lets_the_demand_be_placed_validly(layout, wanted, seed):
    """Whatever the running layout: when the plan says evicting its victims makes room, releasing exactly them lets
    the demand be placed, and the card's layout stays valid; an infeasible plan means no subset would do."""
    engine = MigEngine([MigNode("n1", 64_000, 512 * 1024, (Card(0, "H100 80GB", H100, mig=True),))])
    holdings = []
    for k, name in enumerate(layout):  # fill the card with what fits, each instance its own holder
        demand = SliceDemand(f"r{k}", profile=name, models=frozenset({"H100 80GB"}))
        binding = engine.place_one(demand)
        if isinstance(binding, MigBinding):
            holdings.append(Holding(binding.demand_id, "n1", binding.placed, 0, 0, 10, float(seed % (k + 1))))
    demand = SliceDemand("winner", profile=wanted, models=frozenset({"H100 80GB"}))
    plan = engine.plan_preemption(demand, holdings)
    if not plan.feasible:
        for holding in holdings:  # evicting everything would have made room: the plan must not miss it
            engine.release(MigBinding(holding.id, "n1", holding.placed, 0, 0))
        assert not engine.fits(demand)
        return
    binding = release_and_place(engine, holdings, set(plan.victims), demand)
    assert isinstance(binding, MigBinding)
    for _node, _card, geometry, instances in engine.layouts():
        assert layout_problems(geometry, instances) == []
