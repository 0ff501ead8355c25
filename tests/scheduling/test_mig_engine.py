"""Geometry-true MIG placement (scheduling.mig): NVIDIA's tables, layout rules, the fragmentation score, reasons,
and hypothesis properties over every seeded model: no layout the engine produces overlaps or breaks a placement
rule, and a slice demand waits only when no card has a valid free placement for it."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.mig import (
    CAPACITY_IN_USE,
    FRAGMENTATION,
    NO_MATCHING_SPEC,
    SEEDED,
    Card,
    Instance,
    MigBinding,
    MigEngine,
    MigNode,
    MigPending,
    SliceDemand,
    fits_somehow,
    free_starts,
    geometry_problems,
    layout_problems,
)

H100 = SEEDED["H100 80GB"]
A100_40 = SEEDED["A100 40GB"]


def test_seeded_tables_are_consistent_and_match_the_guide():
    assert sorted(SEEDED) == [
        "A100 40GB",
        "A100 80GB",
        "A30 24GB",
        "B200 180GB",
        "H100 80GB",
        "H100 94GB",
        "H200 141GB",
    ]
    for geometry in SEEDED.values():
        assert geometry_problems(geometry) == [], geometry.model
        assert "Multi-Instance GPU User Guide" in geometry.source
    # A100 40GB as the guide and `nvidia-smi mig -lgipp` give it.
    placements = {p.name: (p.profile_id, p.starts, p.memory_slices) for p in A100_40.profiles}
    assert placements["1g.5gb"] == (19, (0, 1, 2, 3, 4, 5, 6), 1)
    assert placements["1g.10gb"] == (15, (0, 2, 4, 6), 2)
    assert placements["2g.10gb"] == (14, (0, 2, 4), 2)
    assert placements["3g.20gb"] == (9, (0, 4), 4)
    assert placements["4g.20gb"] == (5, (0,), 4)
    assert placements["7g.40gb"] == (0, (0,), 8)
    # H100 80GB offers 1g.10gb x7, 1g.20gb x4, 2g.20gb x3, 3g.40gb x2, 4g.40gb x1, 7g.80gb x1.
    limits = {p.name: p.max_instances for p in H100.profiles}
    assert limits == {
        "1g.10gb": 7,
        "1g.10gb+me": 1,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    }
    a30 = SEEDED["A30 24GB"]
    assert (a30.compute_slices, a30.memory_slices) == (4, 4)
    assert {p.name: p.starts for p in a30.profiles}["2g.12gb"] == (0, 2)


def test_layout_rules():
    assert layout_problems(A100_40, [("3g.20gb", 0, 4), ("3g.20gb", 4, 4)]) == []
    assert layout_problems(A100_40, [("4g.20gb", 0, 4), ("3g.20gb", 4, 4)]) == []
    overlap = layout_problems(A100_40, [("3g.20gb", 0, 4), ("2g.10gb", 2, 2)])
    assert overlap == ["2g.10gb at 2 overlaps memory slices 2–3"]  # noqa: RUF001
    assert layout_problems(A100_40, [("3g.20gb", 2, 4)]) == [
        "3g.20gb cannot start at memory slice 2 with size 4 (starts 0 or 4)"
    ]
    assert layout_problems(A100_40, [("1g.5gb", 7, 1)])  # slice 7 is only reachable by the larger profiles
    # The milli-share model's classic impossibility: 3g + 3g + 1g is 998 milli but uses 9 memory slices.
    assert not fits_somehow(A100_40, ["3g.20gb", "3g.20gb", "1g.5gb"])
    assert fits_somehow(A100_40, ["4g.20gb", "2g.10gb", "1g.5gb"])
    assert not fits_somehow(A100_40, ["4g.20gb", "4g.20gb"])


def test_geometry_problems_catch_bad_edits():
    from dataclasses import replace

    bad = replace(H100, profiles=(replace(H100.profiles[4], placements=((2, 4), (6, 4))),))
    problems = geometry_problems(bad)
    assert any("outside the card" in p for p in problems)
    wrong_size = replace(H100, profiles=(replace(H100.profiles[3], placements=((0, 3),)),))
    assert any("has size 3" in p for p in geometry_problems(wrong_size))


def one_card(geometry=H100, instances=(), node="n7", gpus=1, **kwargs):
    cards = tuple(
        Card(j, geometry.model, geometry, mig=True, instances=instances if j == gpus - 1 else ()) for j in range(gpus)
    )
    return MigEngine([MigNode(node, 64000, 262144, cards)], **kwargs)


def test_frag_keeps_the_4g_placement_first_fit_does_not():
    mix = [SliceDemand(f"w{k}", profile=name) for k, name in enumerate(["4g.40gb", "3g.40gb", "3g.40gb"])]
    frag = one_card(workload=mix).place_one(SliceDemand("d", profile="3g.40gb"))
    first = one_card(workload=mix, policy="first-fit").place_one(SliceDemand("d", profile="3g.40gb"))
    assert frag.placed[0].instance.start == 4  # 4g.40gb can start only at 0: keep it free
    assert first.placed[0].instance.start == 0
    assert frag.placed[0].create and frag.placed[0].instance.size == 4


def test_fragmentation_reason_in_mig_terms():
    busy = (Instance("1g.10gb", 0, 1, busy=True), Instance("1g.10gb", 4, 1, busy=True))
    engine = one_card(instances=busy, gpus=4)
    # the first three cards are empty: fill them whole, then ask for a 3g.40gb
    for k in range(3):
        assert isinstance(engine.place_one(SliceDemand(f"whole{k}")), MigBinding)
    pending = engine.place_one(SliceDemand("d", profile="3g.40gb"))
    assert isinstance(pending, MigPending)
    assert pending.reason == FRAGMENTATION
    assert pending.message == (
        "needs 3g.40gb; gpu 3 on node n7 has free memory slices 1–3 and 5–7, no valid 3g placement (starts 0 or 4)"  # noqa: RUF001
    )
    assert pending.numbers["free_memory_slices"] == [1, 2, 3, 5, 6, 7]
    # a 2g.20gb still fits (start 2 or 6? starts are 0, 2, 4: only 2 is free)
    placed = engine.place_one(SliceDemand("e", profile="2g.20gb"))
    assert placed.placed[0].instance.start == 2


def test_whole_cards_only_on_whole_mode_or_empty_cards_and_pins():
    busy = (Instance("1g.10gb", 0, 1, busy=True),)
    engine = one_card(instances=busy, gpus=2)
    whole = engine.place_one(SliceDemand("w"))
    assert whole.placed[0].card == 0 and whole.placed[0].mode == "whole"  # the empty MIG card changes mode
    assert engine.place_one(SliceDemand("w2")).reason == CAPACITY_IN_USE  # card 1 holds a running instance
    # pinned: its idle instances are used as they are, nothing is created, no mode change
    idle = (Instance("3g.40gb", 0, 4, gi_id=2, ci_id=0, uuid="MIG-abc"), Instance("3g.40gb", 4, 4, gi_id=1))
    card = Card(0, H100.model, H100, mig=True, instances=idle, pinned=True)
    pinned = MigEngine([MigNode("p", 64000, 262144, (card,))])
    got = pinned.place_one(SliceDemand("s", profile="3g.40gb"))
    assert not got.placed[0].create and got.placed[0].instance.uuid == "MIG-abc"
    assert pinned.place_one(SliceDemand("t", profile="1g.10gb")).reason == CAPACITY_IN_USE
    assert pinned.place_one(SliceDemand("u")).reason == CAPACITY_IN_USE
    assert pinned.place_one(SliceDemand("v", profile="5g.50gb")).reason == NO_MATCHING_SPEC


def test_release_destroys_the_instance_and_frees_the_card():
    engine = one_card()
    first = engine.place_one(SliceDemand("a", profile="4g.40gb"))
    assert engine.place_one(SliceDemand("b")).reason == CAPACITY_IN_USE
    engine.release(first)
    assert list(engine.layouts()) == [("n7", 0, H100, [])]
    assert isinstance(engine.place_one(SliceDemand("b")), MigBinding)


# ---------------------------------------------------------------------------------------------------- properties

SLICE_MODELS = sorted(SEEDED)


@st.composite
def scenarios(draw):
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        cards = []
        for j in range(draw(st.integers(1, 4))):
            model = draw(st.sampled_from([*SLICE_MODELS, "T4"]))
            if model == "T4":
                cards.append(Card(j, model))
            else:
                cards.append(Card(j, model, SEEDED[model], mig=draw(st.booleans()), pinned=False))
        nodes.append(MigNode(f"n{n}", draw(st.integers(1, 8)) * 8000, 262144, tuple(cards)))
    profiles = sorted({p.name for g in SEEDED.values() for p in g.profiles})
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("slice"), st.sampled_from(profiles), st.integers(0, 8000)),
                st.tuples(st.just("slices"), st.sampled_from(profiles), st.integers(0, 8000)),
                st.tuples(st.just("whole"), st.integers(1, 2), st.integers(0, 8000)),
                st.tuples(st.just("release"), st.integers(0, 50), st.just(0)),
            ),
            min_size=1,
            max_size=40,
        )
    )
    return nodes, steps, draw(st.sampled_from(["frag", "first-fit"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_no_produced_layout_is_impossible(scenario):
    nodes, steps, policy = scenario
    workload = [SliceDemand("w0", profile=s[1]) for s in steps if s[0] == "slice"] + [SliceDemand("w1")]
    engine = MigEngine(nodes, policy=policy, workload=workload, seed=3)
    held: list[MigBinding] = []
    for n, (kind, value, cpu) in enumerate(steps):
        if kind == "release":
            if held:
                engine.release(held.pop(value % len(held)))
        else:
            if kind == "slice":
                demand = SliceDemand(f"d{n}", profile=value, cpu_milli=cpu)
            elif kind == "slices":  # two instances, on two cards of one node
                demand = SliceDemand(f"d{n}", count=2, profile=value, cpu_milli=cpu)
            else:
                demand = SliceDemand(f"d{n}", count=value, cpu_milli=cpu)
            outcome = engine.place_one(demand)
            if isinstance(outcome, MigBinding):
                held.append(outcome)
                assert len({p.card for p in outcome.placed}) == len(outcome.placed) == demand.count
                for placed in outcome.placed:
                    if placed.instance is not None:
                        card = nodes[engine.node_index[outcome.node]].cards[placed.card]
                        profile = card.geometry.profile(value)
                        assert (placed.instance.start, placed.instance.size) in profile.placements
            elif kind == "slice" and outcome.reason != NO_MATCHING_SPEC:
                # Waiting is honest: no card with room for the CPU has a valid free placement of the profile.
                for i, node in enumerate(nodes):
                    if engine.cpu[i] < cpu:
                        continue
                    for j, state in enumerate(engine.cards[i]):
                        if state[0] == "m" and node.cards[j].geometry.profile(value):
                            g = node.cards[j].geometry
                            counts = {}
                            for name, _s, _z in state[4]:
                                counts[name] = counts.get(name, 0) + 1
                            assert not free_starts(g, g.profile(value), state[2], state[3], counts)
        for _node, _card, geometry, layout in engine.layouts():
            assert layout_problems(geometry, layout) == []
    # everything held is consistent with the engine's CPU accounting
    for i, node in enumerate(nodes):
        used = sum(b.cpu_milli for b in held if b.node == node.name)
        assert engine.cpu[i] == node.cpu_milli - used


@pytest.mark.parametrize("model", SLICE_MODELS)
def test_each_model_fills_to_a_valid_full_card(model):
    geometry = SEEDED[model]
    engine = one_card(geometry)
    smallest = min(geometry.profiles, key=lambda p: (p.memory_slices, p.compute, "+" in p.name))
    placed = []
    while True:
        outcome = engine.place_one(SliceDemand(f"d{len(placed)}", profile=smallest.name))
        if not isinstance(outcome, MigBinding):
            break
        placed.append(outcome)
    assert len(placed) == smallest.max_instances
    ((_node, _card, _g, layout),) = engine.layouts()
    assert layout_problems(geometry, layout) == []


def test_the_benchmark_ceilings_place_in_order_or_choose_in_hindsight():
    """One H100: seven 0.1-share pods (1g.10gb each) then a whole-card pod. Placed in arrival order the seven fill
    the card's compute and the whole pod finds no room (700 of 1000); knowing the sequence, the whole pod alone
    counts more (1000), which only refusing the seven would give."""
    from bench.mig import _pooled_in_order, _surrogate_lp
    from bench.traces import Pod

    small = [Pod(f"p{k}", 1000, 1024, 1, 100, frozenset()) for k in range(7)]
    whole = Pod("whole", 1000, 1024, 1, 1000, frozenset())
    assert _pooled_in_order([*small, whole], mig_cards=1, plain=0) == 700
    assert _pooled_in_order([*small, whole], mig_cards=1, plain=1) == 1700  # a plain card takes the whole pod
    assert min(_surrogate_lp([*small, whole], 1000, k / 20) for k in range(21)) == pytest.approx(1000)
