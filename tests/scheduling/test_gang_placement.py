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


def node(name: str, rack: str, block: str = "b1", cards: int = 8, site: str = "dc", backend: str = "") -> NodeView:
    devices = tuple(DeviceView(index, "h100") for index in range(cards))
    return NodeView(name, 64_000, 512 * 1024, devices, site=site, block=block, rack=rack, backend=backend)


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
    assert never.numbers == {"nodes": 4, "level": "rack", "largest": 3, "domain": "r1", "backend": ""}
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


# --- one backend per gang -------------------------------------------------------------------------------------------


def mixed_rack(slurm: int, container: int, rack: str = "r1") -> list[NodeView]:
    """One rack holding `slurm` Slurm nodes and `container` container nodes."""
    return [node(f"{rack}-s{i}", rack, backend="slurm") for i in range(slurm)] + [
        node(f"{rack}-c{i}", rack, backend="container") for i in range(container)
    ]


def test_a_gang_never_spans_two_backends_even_inside_one_rack():
    """Four free nodes in one rack, two of each backend (a third Slurm node is busy): a 3-node gang cannot run there
    as one job, even where it may spill anywhere."""
    engine = PlacementEngine(Snapshot(mixed_rack(3, 2), [busy("r1-s2")]))
    waiting = engine.place_one(gang(nodes=3, mode=PREFERRED))
    assert waiting.reason == TOPOLOGY_CONSTRAINT
    assert waiting.message == (
        "needs 3 free nodes × 8 h100 on one backend (a gang runs as one job); best backend container has 2 "  # noqa: RUF001
        "(4 such nodes are free in all: container 2, slurm 2)"
    )
    assert waiting.numbers["free_by_backend"] == {"container": 2, "slurm": 2}
    placed = engine.place_one(gang(nodes=2, demand_id="pair"))
    assert len({b.node.split("-")[1][0] for b in placed}) == 1  # both Slurm or both container nodes


def test_a_required_gang_takes_the_rack_whose_one_backend_holds_it():
    """r1 is the tightest rack with 3 free nodes, but 2 Slurm and 1 container; r2 has 4 Slurm nodes: the 3-node gang
    goes to r2 (a blind best fit would have mixed r1's backends)."""
    engine = PlacementEngine(Snapshot(mixed_rack(2, 1) + mixed_rack(4, 0, rack="r2")))
    placed = engine.place_one(gang(nodes=3))
    assert {b.node[:4] for b in placed} == {"r2-s"} and len({b.node for b in placed}) == 3


def test_a_rack_split_over_backends_waits_with_the_numbers_per_backend():
    """Each rack could hold the gang on its busy backend; free now are 2 + 1 in one rack and 1 + 2 in the other."""
    nodes = mixed_rack(3, 1) + mixed_rack(1, 3, rack="r2")
    engine = PlacementEngine(Snapshot(nodes, [busy("r1-s2", allocation_id="a"), busy("r2-c2", allocation_id="b")]))
    waiting = engine.place_one(gang(nodes=3))
    assert waiting.reason == TOPOLOGY_CONSTRAINT
    assert waiting.message == (
        "needs 3 free nodes × 8 h100 in one rack of one backend; best rack r2 (container) has 2 "  # noqa: RUF001
        "(6 such nodes are free in all: container 3, slurm 3)"
    )
    assert (waiting.numbers["best_domain"], waiting.numbers["backend"]) == ("r2", "container")


def test_never_fits_counts_one_backend_and_says_when_mixing_would_have_held_it():
    engine = PlacementEngine(Snapshot(mixed_rack(3, 2)))
    never = engine.never_fits(gang(nodes=4))
    assert never.reason == NO_MATCHING_SPEC
    assert (
        "no rack of one backend has 4 nodes that could hold 8×h100: the largest has 3 (r1, slurm), though r1 has 5 "  # noqa: RUF001
        "over 2 backends (a gang runs on one), so it can never run on this inventory" in never.message
    )
    assert never.numbers == {"nodes": 4, "level": "rack", "largest": 3, "domain": "r1", "backend": "slurm"}
    fleet = engine.never_fits(gang(nodes=4, mode=PREFERRED))
    assert "no backend has 4 nodes that could hold 8×h100: the largest has 3 (slurm)" in fleet.message  # noqa: RUF001
    assert engine.never_fits(gang(nodes=3)) is None
