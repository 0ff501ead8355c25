"""fgd-plus: model pressure from the workload's shapes steers unconstrained demands off contested models; CPU-only
demands prefer nodes whose devices are all in use; without model constraints the GPU choice is FGD's."""

from scheduling.engine import Demand, DeviceView, NodeView, PlacementEngine, Snapshot
from scheduling.engine.policies import make_policy


def node(name, n, model, cpu=64000, mem=1 << 18):
    return NodeView(name, cpu, mem, tuple(DeviceView(j, model) for j in range(n)))


T4 = frozenset({"T4"})
# typical demand: half of the GPU pods may run only on T4, the rest anywhere
SHAPES = [(4000, 0, 1, 1000, T4)] * 10 + [(4000, 0, 1, 1000, frozenset())] * 10 + [(2000, 0, 0, 0, frozenset())] * 5


def engine(nodes, shapes=SHAPES, policy="fgd-plus", seed=0):
    return PlacementEngine(Snapshot(nodes), make_policy(policy, shapes), seed=seed)


def test_pressure_counts_only_constrained_demand():
    e = engine([node("t4", 2, "T4"), node("g2", 8, "G2")])
    assert e.policy.pressure["G2"] == 0.0
    assert e.policy.pressure["T4"] > 0.0


def test_unconstrained_pod_keeps_off_the_contested_model():
    # a T4 card half used by a T4-only pod: plain FGD fills its free half with the next unconstrained 500m pod
    # (that removes a fragment); fgd-plus keeps it for T4-only demand and opens a G2 card instead
    shapes = SHAPES + [(2000, 0, 1, 500, T4)] * 5 + [(2000, 0, 1, 500, frozenset())] * 5
    for policy, expected in (("fgd", "t4"), ("fgd-plus", "g2")):
        for seed in range(10):  # whatever the seeded node order
            e = engine([node("t4", 2, "T4"), node("g2", 2, "G2")], shapes, policy, seed)
            assert e.place_one(Demand("t4-only", count=1, share=500, models=T4, cpu_milli=2000))[0].node == "t4"
            [binding] = e.place_one(Demand("any", count=1, share=500, cpu_milli=2000))
            assert binding.node == expected, (policy, seed)


def test_unconstrained_pod_falls_back_to_the_contested_model_when_nothing_else_fits():
    e = engine([node("t4", 2, "T4"), node("g2", 1, "G2")])
    assert e.place_one(Demand("a", count=1, cpu_milli=4000))[0].node == "g2"
    assert e.place_one(Demand("b", count=1, cpu_milli=4000))[0].node == "t4"


def test_cpu_only_pod_prefers_a_node_without_idle_devices():
    for seed in range(20):
        e = engine([node("busy", 1, "G2"), node("idle", 1, "G2")], seed=seed)
        e.place_one(Demand("gpu", count=1, cpu_milli=4000, models=frozenset({"G2"})))
        busy = next(n.name for i, n in enumerate(e.nodes) if e.free[i] == [0])
        [binding] = e.place_one(Demand("cpu", count=0, cpu_milli=2000))
        assert binding.node == busy


def test_without_model_constraints_it_places_like_fgd():
    shapes = [(2000, 0, 1, 500, frozenset())] * 6 + [(2000, 0, 1, 1000, frozenset())] * 4
    nodes = [node("a", 2, "G2"), node("b", 4, "G2"), node("c", 1, "T4")]
    demands = [
        Demand(f"d{k}", count=1, share=share, cpu_milli=2000)
        for k, share in enumerate([500, 1000, 500, 250, 750, 1000, 500, 500, 1000])
    ]
    for seed in range(5):
        plus, fgd = engine(nodes, shapes, seed=seed), engine(nodes, shapes, "fgd", seed=seed)
        assert [plus.place_one(d) for d in demands] == [fgd.place_one(d) for d in demands]
