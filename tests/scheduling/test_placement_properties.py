"""Property-based checks of the placement engine on random clusters and demands."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import (
    DEGRADED,
    HEALTHY,
    ISOLATED,
    REASONS,
    Binding,
    Demand,
    DeviceView,
    NodeView,
    PlacementEngine,
    Snapshot,
)
from scheduling.engine.frag import MILLI
from scheduling.engine.policies import POLICIES

MODELS = ["H100", "A100", "T4"]
# Slice-profile tables per model, as an inventory has them (a profile one model lacks makes a slice wait there).
SLICES = {
    "H100": {"1g.10gb": 143, "3g.40gb": 429, "half": 500},
    "A100": {"1g.10gb": 143, "half": 500},
    "T4": {"half": 500, "quarter": 250},
}
PROFILES = sorted({name for table in SLICES.values() for name in table})


@st.composite
def clusters(draw, sliced=False):
    """Up to six nodes of one model each; with `sliced`, the devices carry their model's slice-profile table."""
    nodes = []
    for n in range(draw(st.integers(1, 6))):
        model = draw(st.sampled_from(MODELS))
        devices = tuple(
            DeviceView(
                j,
                model,
                health=draw(st.sampled_from([HEALTHY, HEALTHY, HEALTHY, DEGRADED, ISOLATED])),
                slice_profiles=SLICES[model] if sliced else {},
            )
            for j in range(draw(st.integers(0, 8)))
        )
        nodes.append(
            NodeView(
                f"n{n}",
                draw(st.integers(1, 16)) * 4000,
                draw(st.integers(1, 16)) * 16384,
                devices,
                schedulable=draw(st.booleans()) or n == 0,
            )
        )
    return Snapshot(nodes)


@st.composite
def demands(draw, sliced=False):
    """Up to 25 demands of whole cards, shares and CPU only; with `sliced`, some ask for a slice profile."""
    out = []
    for k in range(draw(st.integers(1, 25))):
        share = draw(st.sampled_from([MILLI, MILLI, 500, 250, 700]))
        count = 1 if share < MILLI else draw(st.sampled_from([0, 1, 1, 2, 4, 8]))
        models = frozenset(draw(st.lists(st.sampled_from(MODELS), max_size=2)))
        profile = draw(st.sampled_from([None, *PROFILES])) if sliced else None
        if profile is not None:
            share, count = MILLI, draw(st.integers(1, 2))
        out.append(
            Demand(
                f"d{k}",
                count=count,
                share=share,
                slice_profile=profile,
                models=models,
                cpu_milli=draw(st.integers(0, 8)) * 1000,
                memory_mib=draw(st.integers(0, 4)) * 8192,
                priority=draw(st.integers(0, 3)),
            )
        )
    return out


def _check(snapshot: Snapshot, demand_list: list[Demand], bindings: list[Binding]):
    nodes = {node.name: node for node in snapshot.nodes}
    by_id = {demand.id: demand for demand in demand_list}
    used_milli: dict[tuple[str, int], int] = {}
    cpu: dict[str, int] = {}
    mem: dict[str, int] = {}
    for binding in bindings:
        node = nodes[binding.node]
        demand = by_id[binding.demand_id]
        assert node.schedulable
        assert len(binding.devices) == demand.count
        assert len({j for j, _ in binding.devices}) == demand.count  # distinct devices, all on this one node
        for j, milli in binding.devices:
            device = node.devices[j]
            assert device.health == HEALTHY
            assert not demand.models or device.model in demand.models
            assert milli == demand.share
            used_milli[(node.name, j)] = used_milli.get((node.name, j), 0) + milli
        cpu[node.name] = cpu.get(node.name, 0) + binding.cpu_milli
        mem[node.name] = mem.get(node.name, 0) + binding.memory_mib
    for (name, j), milli in used_milli.items():
        assert milli <= nodes[name].devices[j].capacity
    for name in cpu:
        assert cpu[name] <= nodes[name].cpu_milli and mem[name] <= nodes[name].memory_mib
    assert len({binding.demand_id for binding in bindings}) == len(bindings)  # one node per demand


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), demands(), st.sampled_from(sorted(POLICIES)), st.integers(0, 5))
def test_never_overcommits_and_honours_constraints(snapshot, demand_list, policy, seed):
    result = PlacementEngine(snapshot, policy, seed=seed, workload=demand_list).place(demand_list)
    _check(snapshot, demand_list, result.bindings)
    placed = {b.demand_id for b in result.bindings}
    pending = {p.demand_id for p in result.pending}
    assert placed | pending == {d.id for d in demand_list} and not placed & pending
    assert all(p.reason in REASONS and p.message for p in result.pending)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), demands(), st.sampled_from(sorted(POLICIES)), st.integers(0, 5))
def test_same_seed_same_result(snapshot, demand_list, policy, seed):
    first = PlacementEngine(snapshot, policy, seed=seed, workload=demand_list).place(demand_list)
    second = PlacementEngine(snapshot, policy, seed=seed, workload=demand_list).place(demand_list)
    assert first == second


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), demands())
def test_cached_path_matches_uncached_scan(snapshot, demand_list):
    """The lazy per-shape heaps choose exactly what a full scan over all nodes would choose."""
    cached = PlacementEngine(snapshot, "fgd", seed=3, workload=demand_list)
    scanned = PlacementEngine(snapshot, "fgd", seed=3, workload=demand_list)
    for demand in demand_list:
        shape = _shape(demand)
        assert cached._best_node(shape) == _scan(scanned, shape)
        outcome = cached.place_one(demand)
        if isinstance(outcome, list):
            for binding in outcome:
                scanned._apply(scanned.node_index[binding.node], binding.devices, binding.cpu_milli, binding.memory_mib)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(sliced=True), demands(sliced=True), st.sampled_from(sorted(POLICIES)))
def test_slices_share_scores_across_nodes_and_choose_as_a_full_scan(snapshot, demand_list, policy):
    """With one slice table per model (as an inventory has them) nodes of the same device tuple and CPU class share a
    slice's score, as they share a whole card's: each choice is what a plain scan of every node would make, and an
    engine that reads each node's own tables (per node, exact) places the same."""
    cached = PlacementEngine(snapshot, policy, seed=3, workload=demand_list)
    scanned = PlacementEngine(snapshot, policy, seed=3, workload=demand_list)
    per_node = PlacementEngine(snapshot, policy, seed=3, workload=demand_list)
    assert cached._slices_by_model
    per_node._slices_by_model = False
    if policy != "random":  # the random baseline draws nodes instead of scoring them
        for demand in demand_list:
            assert cached._best_node(_shape(demand)) == _scan(scanned, _shape(demand))
            scanned.place_one(demand)
            cached.place_one(demand)
    fresh = PlacementEngine(snapshot, policy, seed=3, workload=demand_list)
    assert fresh.place(demand_list) == per_node.place(demand_list)


def test_a_model_with_two_slice_tables_is_read_per_node():
    """Two H100 nodes whose cards slice differently: the share of a slice follows the node, not the model."""
    other = {**SLICES["H100"], "half": 600}
    snapshot = Snapshot(
        [
            NodeView("a", 8000, 65536, (DeviceView(0, "H100", slice_profiles=SLICES["H100"]),)),
            NodeView("b", 8000, 65536, (DeviceView(0, "H100", slice_profiles=other),)),
        ]
    )
    engine = PlacementEngine(snapshot, "fgd-plus")
    assert not engine._slices_by_model
    bindings = engine.place([Demand(f"s{k}", slice_profile="half") for k in range(3)]).bindings
    assert sorted((b.node, b.devices) for b in bindings) == [("a", ((0, 500),)), ("a", ((0, 500),)), ("b", ((0, 600),))]


def _scan(engine, shape):
    """The best (node index, picks) by a plain scan of every schedulable node: score, then the seeded node order."""
    best = None
    for i, node in enumerate(engine.nodes):
        result = engine._evaluate(engine.state[i], shape, node) if node.schedulable else None
        if result and (best is None or (result[0], engine.rank[i]) < best[:2]):
            best = (result[0], engine.rank[i], i, result[1])
    return None if best is None else best[2:]


def _shape(demand):
    from scheduling.engine.model import DemandShape

    return DemandShape(demand)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), demands())
def test_unscored_fit_check_answers_as_fits_while_placing(snapshot, demand_list):
    """The held-back check of `place` (first feasible node, remembered per shape) says what `fits` says, at every
    step of a sequence of placements on the same engine."""
    engine = PlacementEngine(snapshot, "default", workload=demand_list)
    known: dict = {}
    for demand in demand_list:
        for probe in demand_list:
            assert engine.fits_now(probe, known) == engine.fits(probe)
        engine.place_one(demand)
