"""Preemption planning for multi-node gangs on the engine: the victims are all inside one domain of the gang's level
(never across racks for a required-rack gang), the domain with the cheapest victims wins, a victim gang frees every
node it runs on, and when no single domain can be freed enough nobody is planned and the plan says how close the best
domain comes. Pure: no database."""

from scheduling.engine import PREFERRED, Demand, DeviceView, NodeView, PlacementEngine, RunningAllocation, Snapshot

H100 = frozenset({"h100"})


def node(name: str, rack: str, block: str = "b1", backend: str = "slurm") -> NodeView:
    devices = tuple(DeviceView(index, "h100") for index in range(8))
    return NodeView(name, 64_000, 512 * 1024, devices, site="dc", block=block, rack=rack, backend=backend)


def racks(*sizes: int, block: str = "b1") -> list[NodeView]:
    return [node(f"r{r}-n{i}", f"r{r}", block) for r, size in enumerate(sizes, start=1) for i in range(size)]


def gang(nodes: int = 2, mode: str = "required", level: str = "rack", priority: int = 5) -> Demand:
    return Demand(
        "g",
        count=8,
        models=H100,
        cpu_milli=16_000,
        memory_mib=65536,
        priority=priority,
        nodes=nodes,
        level=level,
        mode=mode,
    )


def job(allocation_id: str, on: str, cards=range(8), priority: int = 1, preemptible: bool = True, started: float = 0):
    devices = tuple((j, 1000) for j in cards)
    return RunningAllocation(allocation_id, on, devices, priority=priority, preemptible=preemptible, started_at=started)


def state(engine: PlacementEngine):
    return [list(free) for free in engine.free], list(engine.cpu), list(engine.mem)


def test_a_required_rack_gang_preempts_inside_one_rack_only():
    """r1 has a free node and one victim; r2's two nodes each run a victim: the plan evicts r1's one."""
    running = [job("a", "r1-n1"), job("b", "r2-n0"), job("c", "r2-n1")]
    engine = PlacementEngine(Snapshot(racks(2, 2), running))
    before = state(engine)
    plan = engine.plan_preemption(gang())
    assert plan.feasible and plan.victims == ("a",)
    assert (plan.level, plan.domain, plan.nodes) == ("rack", "r1", ("r1-n1",))
    assert plan.where == "in rack r1 (freeing r1-n1)"
    assert plan.numbers == {"level": "rack", "domain": "r1", "nodes": ["r1-n1"]}
    assert state(engine) == before  # planning reads the state, never changes it


def test_the_rack_with_the_cheapest_victims_wins():
    """r1 needs two victims (two half-node jobs), r2 one: r2's; with one victim each, the lower priority goes."""
    running = [job("a1", "r1-n1", range(4)), job("a2", "r1-n1", range(4, 8)), job("b", "r2-n1")]
    engine = PlacementEngine(Snapshot(racks(2, 2), running))
    plan = engine.plan_preemption(gang())
    assert plan.victims == ("b",) and plan.domain == "r2"

    running = [job("a", "r1-n1", priority=2), job("b", "r2-n1", priority=3)]
    assert PlacementEngine(Snapshot(racks(2, 2), running)).plan_preemption(gang()).victims == ("a",)


def test_a_victim_gang_counts_once_for_every_node_it_frees():
    """r1 runs one lower-priority gang over both its nodes (one victim), r2 two one-node jobs: r1's gang goes."""
    running = [job("low-gang", "r1-n0"), job("low-gang", "r1-n1"), job("x", "r2-n0"), job("y", "r2-n1")]
    engine = PlacementEngine(Snapshot(racks(2, 2), running))
    plan = engine.plan_preemption(gang())
    assert plan.victims == ("low-gang",) and plan.nodes == ("r1-n0", "r1-n1")


def test_no_victims_when_no_single_rack_can_hold_it_even_after_preemption():
    """Evicting "a" would give two free nodes, but in two racks: a required-rack gang plans nobody and says how close
    the best rack comes."""
    running = [job("fixed", "r1-n1", preemptible=False), job("a", "r2-n0"), job("higher", "r2-n1", priority=9)]
    engine = PlacementEngine(Snapshot(racks(2, 2), running))
    plan = engine.plan_preemption(gang())
    assert not plan.feasible and plan.victims == ()
    assert plan.message == (
        "no rack could hold all 2 nodes even after preempting every lower-priority allocation it may evict; "
        "the best, r1, could offer 1"
    )
    assert (plan.domain, plan.reachable) == ("r1", 1)
    assert engine.plan_preemption(gang(level="block")).victims == ("a",)  # one block holds both racks


def test_the_callers_rules_say_who_may_be_evicted():
    running = [job("mine", "r1-n1"), job("theirs", "r2-n1", priority=0)]
    engine = PlacementEngine(Snapshot(racks(2, 2), running))
    plan = engine.plan_preemption(gang(), evictable=lambda allocation: allocation.id == "mine")
    assert plan.victims == ("mine",)  # "theirs" is cheaper but not allowed


def test_a_preferred_gang_is_planned_at_its_level_first_then_the_next():
    """Three nodes: no rack has three, so the preferred gang's victims are in one block, the fewest there."""
    running = [job("a", "r1-n1"), job("b", "r2-n0"), job("c", "r2-n1")]
    engine = PlacementEngine(Snapshot(racks(2, 2), running))
    plan = engine.plan_preemption(gang(nodes=3, mode=PREFERRED))
    assert plan.feasible and plan.level == "block" and plan.domain == "b1"
    assert len(plan.victims) == 2 and "a" in plan.victims


def test_a_gangs_victims_are_on_nodes_of_one_backend():
    """The rack's container node runs the only victim, but the free node is a Slurm node: one job cannot span both,
    so nothing is planned."""
    nodes = [node("r1-n0", "r1"), node("r1-c0", "r1", backend="container")]
    engine = PlacementEngine(Snapshot(nodes, [job("a", "r1-c0")]))
    plan = engine.plan_preemption(gang())
    assert not plan.feasible and plan.victims == ()
