"""The placement engine and multi-node gangs: all members or none, each on a distinct node, inside one domain of the
asked level (best fit by domain), preferred gangs spilling to the next level with the split recorded, and the
reasons with their numbers. Pure: no database."""

from scheduling.engine import (
    CAPACITY_IN_USE,
    NO_MATCHING_SPEC,
    PREFERRED,
    TOPOLOGY_CONSTRAINT,
    Demand,
    DeviceView,
    NodeView,
    PlacementEngine,
    RunningAllocation,
    Snapshot,
    gang_split,
)

H100 = frozenset({"h100"})


def node(name: str, rack: str, block: str = "b1", cards: int = 8, site: str = "dc") -> NodeView:
    devices = tuple(DeviceView(index, "h100") for index in range(cards))
    return NodeView(name, 64_000, 512 * 1024, devices, site=site, block=block, rack=rack)


def gang(nodes: int = 2, level: str = "rack", mode: str = "required", demand_id: str = "g", count: int = 8) -> Demand:
    return Demand(
        demand_id, count=count, models=H100, cpu_milli=16_000, memory_mib=65536, nodes=nodes, level=level, mode=mode
    )


def busy(name: str, cards: int = 1, allocation_id: str = "x") -> RunningAllocation:
    return RunningAllocation(allocation_id, name, tuple((j, 1000) for j in range(cards)))


def racks(*sizes: int, block: str = "b1", prefix: str = "r") -> list[NodeView]:
    return [
        node(f"{prefix}{r}-n{i}", f"{prefix}{r}", block) for r, size in enumerate(sizes, start=1) for i in range(size)
    ]


def test_a_gang_is_placed_whole_on_distinct_nodes_of_one_rack():
    engine = PlacementEngine(Snapshot(racks(3, 3)))
    bindings = engine.place_one(gang(nodes=3))
    assert len(bindings) == 3 and len({b.node for b in bindings}) == 3
    assert len({b.node.split("-")[0] for b in bindings}) == 1
    assert [b.member for b in bindings] == [0, 1, 2]
    assert all(len(b.devices) == 8 and b.cpu_milli == 16_000 for b in bindings)


def test_a_gang_that_does_not_fit_binds_nothing():
    nodes = racks(2)
    engine = PlacementEngine(Snapshot(nodes, [busy("r1-n1")]))
    before = ([list(f) for f in engine.free], list(engine.cpu))
    waiting = engine.place_one(gang(nodes=2))
    assert waiting.reason == CAPACITY_IN_USE
    assert waiting.numbers == {"nodes": 2, "cards_per_node": 8, "level": "rack", "free_nodes": 1}
    assert ([list(f) for f in engine.free], list(engine.cpu)) == before


def test_best_fit_keeps_a_whole_free_rack_for_a_larger_gang():
    # r1 is whole (4 free), r2 has 2 of its 4 nodes free: a 2-node gang takes r2, a 4-node gang then still fits r1.
    engine = PlacementEngine(
        Snapshot(racks(4, 4), [busy("r2-n0", allocation_id="a"), busy("r2-n1", allocation_id="b")])
    )
    small = engine.place_one(gang(nodes=2, demand_id="small"))
    assert {b.node for b in small} == {"r2-n2", "r2-n3"}
    large = engine.place_one(gang(nodes=4, demand_id="large"))
    assert {b.node for b in large} == {f"r1-n{i}" for i in range(4)}


def test_members_go_where_they_strand_fewest_cards():
    # 4-card members: nodes with exactly 4 free cards are taken before whole free ones.
    engine = PlacementEngine(Snapshot(racks(4), [busy("r1-n0", 4, "a"), busy("r1-n1", 4, "b")]))
    bindings = engine.place_one(gang(nodes=2, count=4))
    assert {b.node for b in bindings} == {"r1-n0", "r1-n1"}


def test_required_rack_waits_with_the_numbers_while_only_split_capacity_exists():
    engine = PlacementEngine(
        Snapshot(racks(4, 4), [busy("r1-n0", allocation_id="a"), busy("r2-n3", allocation_id="b")])
    )
    waiting = engine.place_one(gang(nodes=4))
    assert waiting.reason == TOPOLOGY_CONSTRAINT
    assert waiting.message == (
        "needs 4 free nodes × 8 h100 in one rack; best rack r1 has 3 (6 such nodes are free in all)"  # noqa: RUF001
    )
    assert waiting.numbers["best_domain"] == "r1" and waiting.numbers["best_free_nodes"] == 3


def test_required_block_holds_a_gang_over_racks_of_one_block():
    nodes = racks(2, 2, block="b1") + racks(2, 2, block="b2", prefix="s")
    engine = PlacementEngine(Snapshot(nodes, [busy("r1-n0")]))
    bindings = engine.place_one(gang(nodes=4, level="block"))
    assert {b.node[0] for b in bindings} == {"s"}  # b2 is whole; b1 has only 3 free nodes


def test_preferred_spills_to_the_block_only_when_no_rack_holds_it_and_records_the_split():
    nodes = racks(3, 2, 3)
    engine = PlacementEngine(Snapshot(nodes))
    together = engine.place_one(gang(nodes=3, mode=PREFERRED, demand_id="a"))  # r1: r3 ties, r1 comes first
    assert gang_split(together, nodes, "rack")["code"] == "gang_together"
    split = engine.place_one(gang(nodes=4, mode=PREFERRED, demand_id="b"))
    note = gang_split(split, nodes, "rack")
    assert note["code"] == "gang_split"
    assert note["numbers"] == {"level": "rack", "level_used": "block", "domains": ["r2", "r3"]}
    assert note["message"] == "4 nodes in 2 racks (r2, r3), inside one block"


def test_a_node_without_topology_is_its_own_rack():
    nodes = [NodeView(f"n{i}", 64_000, 512 * 1024, tuple(DeviceView(j, "h100") for j in range(8))) for i in range(3)]
    engine = PlacementEngine(Snapshot(nodes))
    assert engine.never_fits(gang(nodes=2)).reason == NO_MATCHING_SPEC
    assert len(engine.place_one(gang(nodes=2, mode=PREFERRED))) == 2


def test_never_fits_names_the_largest_domain():
    engine = PlacementEngine(Snapshot(racks(3, 2)))
    never = engine.never_fits(gang(nodes=4))
    assert never.reason == NO_MATCHING_SPEC
    assert "no rack has 4 nodes that could hold 8×h100: the largest has 3 (r1)" in never.message  # noqa: RUF001
    assert never.numbers == {"nodes": 4, "level": "rack", "largest": 3, "domain": "r1"}
    assert engine.never_fits(gang(nodes=4, mode=PREFERRED)) is None
    assert engine.never_fits(gang(nodes=2, count=9)).reason == NO_MATCHING_SPEC  # a member fits no node


def test_isolated_cards_and_cordoned_nodes_take_no_member():
    nodes = racks(3)
    devices = tuple(DeviceView(j, "h100", health="isolated" if j == 0 else "healthy") for j in range(8))
    sick = NodeView("r1-n0", 64_000, 512 * 1024, devices, site="dc", block="b1", rack="r1")
    engine = PlacementEngine(Snapshot([sick, *nodes[1:]]))
    engine.close_node("r1-n1")
    waiting = engine.place_one(gang(nodes=2))
    assert waiting.reason == CAPACITY_IN_USE and waiting.numbers["free_nodes"] == 1
    assert len(engine.place_one(gang(nodes=2, count=7))) == 2  # seven healthy cards on the sick node will do


def test_the_index_follows_what_is_placed_and_released():
    engine = PlacementEngine(Snapshot(racks(2, 2)))
    first = engine.place_one(gang(nodes=2, demand_id="a"))
    second = engine.place_one(gang(nodes=2, demand_id="b"))
    assert {b.node[:2] for b in first} != {b.node[:2] for b in second}
    assert engine.place_one(gang(nodes=2, demand_id="c")).reason == CAPACITY_IN_USE
    for binding in first:
        engine.release(binding)
    assert len(engine.place_one(gang(nodes=2, demand_id="c"))) == 2


def test_place_in_order_keeps_gangs_of_different_sizes_apart():
    engine = PlacementEngine(Snapshot(racks(3)))
    result = engine.place([gang(nodes=4, demand_id="big"), gang(nodes=2, demand_id="small")], backfill=True)
    assert [p.demand_id for p in result.pending] == ["big"]
    assert {b.demand_id for b in result.bindings} == {"small"}


def test_a_fork_places_gangs_on_its_own_state():
    engine = PlacementEngine(Snapshot(racks(2)))
    engine.place_one(gang(nodes=2, demand_id="warm"))  # builds the gang index on the origin
    origin = PlacementEngine(Snapshot(racks(2)))
    origin.fits(gang(nodes=2))
    fork = origin.fork()
    assert len(fork.place_one(gang(nodes=2))) == 2
    assert fork.place_one(gang(nodes=2, demand_id="again")).reason == CAPACITY_IN_USE
