"""The gang benchmark's ceiling: a maximum flow that pools cards per rack and model but keeps gangs on nodes that
could hold a member and required gangs inside one domain with enough such nodes; never below what a placement that
keeps the rules reaches."""

from bench import gang
from bench.gang_bound import FlowNetwork, GangCeiling, hindsight_bound
from scheduling.engine import Demand, DeviceView, NodeView

MEMBER = Demand("member", count=8, cpu_milli=16_000, memory_mib=65536)


def node(name: str, rack: str, block: str = "b1", cards: int = 8, model: str = "h100") -> NodeView:
    devices = tuple(DeviceView(index, model) for index in range(cards))
    return NodeView(name, 64_000, 512 * 1024, devices, site="dc", block=block, rack=rack)


def gang_of(nodes: int, level: str = "rack", mode: str = "required", model: str = "h100") -> Demand:
    return Demand(
        f"g{nodes}{level}{mode}",
        count=8,
        models=frozenset({model}),
        cpu_milli=16_000,
        memory_mib=65536,
        nodes=nodes,
        level=level,
        mode=mode,
    )


def test_the_flow_network_finds_the_maximum_flow_and_grows_with_its_capacities():
    net = FlowNetwork()
    source, a, b, sink = (net.vertex() for _ in range(4))
    first = net.edge(source, a, 5)
    net.edge(source, b, 4)
    net.edge(a, b, 3)
    net.edge(a, sink, 2)
    net.edge(b, sink, 6)
    assert net.flow(source, sink) == 8  # 2 straight from a, 6 through b (3 of them from a)
    first[1] += 10
    assert net.flow(source, sink) == 8  # the sink's edges are full: more supply adds nothing


def test_a_required_gang_counts_only_in_a_domain_with_enough_nodes_that_could_hold_a_member():
    nodes = [node("a1", "ra"), node("a2", "ra"), node("b1", "rb"), node("b2", "rb", cards=4)]
    ceiling = GangCeiling(nodes, MEMBER)
    ceiling.add(gang_of(3))  # no rack has 3 such nodes (b2 has 4 cards): never fits
    assert ceiling.allocated() == 0
    ceiling.add(gang_of(3, mode="preferred"))  # a1, a2 and b1, across racks
    assert ceiling.allocated() == 24_000
    ceiling.add(gang_of(2))  # what is left of a whole node is b2's 4 cards, too small for a member
    assert ceiling.allocated() == 24_000


def test_single_pods_take_the_cards_no_gang_can_use_and_a_block_gang_its_block():
    nodes = [node("a1", "ra", "b1"), node("a2", "rb", "b1"), node("c1", "rc", "b2"), node("t", "rt", "b2", 2, "t4")]
    ceiling = GangCeiling(nodes, MEMBER)
    ceiling.add(gang_of(2, level="block"))  # a1 and a2, one per rack of block b1
    ceiling.add(Demand("pod", count=2, models=frozenset({"t4"})))
    assert ceiling.allocated() == 18_000
    ceiling.add(gang_of(2, level="block"))  # block b2 has one h100 node: this one waits
    ceiling.add(Demand("many", count=1, share=500))
    assert ceiling.allocated() == 18_500


def test_the_bound_is_never_below_what_the_variants_that_keep_required_domains_reach():
    base = gang.traces.read_nodes(str(gang.openb_dir() / gang.NODES_FILE))
    pods = gang.traces.read_pods(str(gang.openb_dir() / gang.PODS_FILE))
    nodes = gang.topology_tree(base, seed=42)
    demands = gang.arrivals(nodes, pods, seed=42, inflate=1.3)[:3000]
    bound = hindsight_bound(nodes, demands, gang.MEMBER)
    for variant in ("platform", "slurm-tree"):
        reached = gang.simulate(nodes, demands, variant, seed=42)["alloc_at_100"]
        assert reached <= bound + 1e-9
    assert bound < 100  # gangs outnumber the nodes that could hold them: the bound is not the trivial 100 %
