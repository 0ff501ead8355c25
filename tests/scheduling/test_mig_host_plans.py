"""What a host runs for a placement is what the card accepts: the plan destroys the idle GPU instances a new one
needs the room of (or the media engines of) before creating it, switches the mode only on a card without instances,
and never asks for a second +me instance. Checked against `tests/scheduling/fake_nvidia_smi.py`, which refuses what
a real card refuses."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.mig import (
    SEEDED,
    Card,
    Instance,
    MigBinding,
    MigEngine,
    MigNode,
    MigPending,
    SliceDemand,
    fits_somehow,
    geometry_problems,
    host_commands,
    layout_problems,
)
from tests.scheduling.fake_nvidia_smi import FakeGpu, FakeHost, NvidiaSmiError

H100 = SEEDED["H100 80GB"]
A30 = SEEDED["A30 24GB"]


def host_with(geometry, layout, *, mig_mode=True, busy=()):
    """A fake host whose card 0 has these instances (profile, start, GI id); `busy` GI ids run a process."""
    host = FakeHost(FakeGpu(0, geometry, mig_mode=mig_mode))
    for profile, start, gi_id in layout:
        host.add_instance(0, profile, start, gi_id, processes=1 if gi_id in busy else 0)
    return host


def engine_with(geometry, layout, *, busy=(), mig_mode=True, workload=()):
    instances = tuple(
        Instance(profile, start, geometry.profile(profile).memory_slices, gi_id=gi, ci_id=0, busy=gi in busy)
        for profile, start, gi in layout
    )
    card = Card(0, geometry.model, geometry, mig=mig_mode, instances=instances)
    return MigEngine([MigNode("n7", 64000, 262144, (card,))], workload=workload)


def plan_of(placed) -> list[list[str]]:
    profile = H100.profile(placed.instance.profile) if placed.instance else None
    return host_commands(
        placed.card,
        destroy=[i.gi_id for i in placed.destroy],
        mode=placed.mode,
        create=(profile.profile_id, placed.instance.start) if placed.create else None,
    )


def test_the_fake_card_refuses_what_a_real_one_does():
    host = host_with(H100, [("1g.10gb", 0, 1), ("1g.10gb", 2, 3)], busy={1})
    with pytest.raises(NvidiaSmiError, match=r"Insufficient Resources.*overlaps"):
        host.run(["nvidia-smi", "mig", "-i", "0", "-cgi", "14:2", "-C"])  # 2g.20gb over the 1g at 2
    with pytest.raises(NvidiaSmiError, match="placement 1: Invalid Argument"):
        host.run(["nvidia-smi", "mig", "-i", "0", "-cgi", "14:1", "-C"])  # 2g.20gb starts at 0, 2 or 4 only
    with pytest.raises(NvidiaSmiError, match="In use by another client"):
        host.run(["nvidia-smi", "mig", "-i", "0", "-dgi", "-gi", "3"])  # its compute instance is still there
    with pytest.raises(NvidiaSmiError, match=r"compute instance ID 0 .* In use by another client"):
        host.run(["nvidia-smi", "mig", "-i", "0", "-gi", "1", "-dci"])  # a process runs in it
    with pytest.raises(NvidiaSmiError, match="In use by another client"):
        host.run(["nvidia-smi", "-i", "0", "-mig", "0"])  # a process runs on the card
    with pytest.raises(NvidiaSmiError, match="GPU instances exist"):
        host_with(H100, [("1g.10gb", 2, 3)]).run(["nvidia-smi", "-i", "0", "-mig", "0"])
    host.run_all(
        [["nvidia-smi", "mig", "-i", "0", "-gi", "3", "-dci"], ["nvidia-smi", "mig", "-i", "0", "-dgi", "-gi", "3"]]
    )
    host.run(["nvidia-smi", "mig", "-i", "0", "-cgi", "14:2", "-C"])
    assert host.gpus[0].layout() == [("1g.10gb", 0, 1), ("2g.20gb", 2, 2)]
    media = host_with(A30, [("1g.6gb+me", 0, 1)])
    with pytest.raises(NvidiaSmiError, match="one set of media engines"):
        media.run(["nvidia-smi", "mig", "-i", "0", "-cgi", "6:2", "-C"])  # 2g.12gb+me beside a 1g.6gb+me
    whole = host_with(H100, [], mig_mode=False)
    with pytest.raises(NvidiaSmiError, match="MIG mode is not enabled"):
        whole.run(["nvidia-smi", "mig", "-i", "0", "-cgi", "9:0", "-C"])


def test_a_slice_over_idle_instances_destroys_those_it_covers_first():
    """The issue's card: 1g.10gb instances at memory slices 0-6 left by earlier work, the one at 0 running. A 2g.20gb
    goes to start 2 or 4; the two idle 1g instances there are destroyed by GPU instance id before it is created."""
    layout = [("1g.10gb", start, start + 1) for start in range(7)]
    engine = engine_with(H100, layout, busy={1})
    placed = engine.place_one(SliceDemand("d", profile="2g.20gb")).placed[0]
    start = placed.instance.start
    assert start in (2, 4) and placed.create
    assert [(i.start, i.gi_id) for i in placed.destroy] == [(start, start + 1), (start + 1, start + 2)]
    host = host_with(H100, layout, busy={1})
    host.run_all(plan_of(placed))
    kept = [(name, s, 1) for name, s, _gi in layout if s not in (start, start + 1)]
    assert host.gpus[0].layout() == sorted([*kept, ("2g.20gb", start, 2)])
    assert layout_problems(H100, host.gpus[0].layout()) == []
    # the next slice on the card does not destroy them again, and destroys only what it covers in turn
    other = engine.place_one(SliceDemand("e", profile="2g.20gb")).placed[0]
    assert {i.start for i in other.destroy} == {other.instance.start, other.instance.start + 1}
    host.run_all(plan_of(other))


def test_an_idle_instance_with_the_same_profile_and_placement_is_used_as_it_is():
    engine = engine_with(H100, [("3g.40gb", 4, 7)])
    mix = [SliceDemand("w", profile="4g.40gb")]
    engine = MigEngine(engine.nodes, workload=mix)
    placed = engine.place_one(SliceDemand("d", profile="3g.40gb")).placed[0]
    assert (placed.instance.start, placed.instance.gi_id, placed.create, placed.destroy) == (4, 7, False, ())


def test_a_second_media_instance_destroys_the_idle_one_even_where_it_does_not_overlap():
    layout = [("1g.10gb+me", 6, 9)]
    engine = engine_with(H100, layout)
    placed = engine.place_one(SliceDemand("d", profile="1g.10gb+me")).placed[0]
    assert [i.gi_id for i in placed.destroy] == [9]
    host = host_with(H100, layout)
    host.run_all(plan_of(placed))
    assert host.gpus[0].layout() == [("1g.10gb+me", placed.instance.start, 1)]


def test_whole_work_on_a_mig_card_destroys_its_idle_instances_and_switches_it_off_mig():
    layout = [("3g.40gb", 0, 2), ("1g.10gb", 4, 5)]
    engine = engine_with(H100, layout)
    placed = engine.place_one(SliceDemand("w")).placed[0]
    assert placed.mode == "whole" and [i.gi_id for i in placed.destroy] == [2, 5]
    host = host_with(H100, layout)
    host.run_all(plan_of(placed))
    assert not host.gpus[0].mig_mode and host.gpus[0].layout() == []


def test_a_slice_on_a_whole_mode_card_switches_it_to_mig_first():
    engine = engine_with(H100, [], mig_mode=False)
    placed = engine.place_one(SliceDemand("d", profile="3g.40gb")).placed[0]
    host = host_with(H100, [], mig_mode=False)
    host.run_all(plan_of(placed))
    assert host.gpus[0].mig_mode and host.gpus[0].layout() == [("3g.40gb", placed.instance.start, 4)]


def test_idle_instances_without_a_gpu_instance_id_are_never_planned_away():
    """An instance a node reported without its id cannot be destroyed by id: it stays, and the card has less room."""
    card = Card(0, H100.model, H100, mig=True, instances=(Instance("4g.40gb", 0, 4),))
    engine = MigEngine([MigNode("n7", 64000, 262144, (card,))])
    assert isinstance(engine.place_one(SliceDemand("d", profile="4g.40gb")), MigPending)
    placed = engine.place_one(SliceDemand("e", profile="3g.40gb")).placed[0]
    assert placed.instance.start == 4 and placed.destroy == ()


# ------------------------------------------------------------------------------------- media engines (issue 32.2)


def test_a_card_holds_one_media_extension_instance_of_any_size():
    both = [("1g.6gb+me", 0, 1), ("2g.12gb+me", 2, 2)]
    assert layout_problems(A30, both) == [
        "2g.12gb+me at 2: a card has one set of media engines (JPEG/OFA): at most one +me instance of any size"
    ]
    assert not fits_somehow(A30, ["1g.6gb+me", "2g.12gb+me"])
    assert fits_somehow(A30, ["1g.6gb+me", "2g.12gb"])
    held = (Instance("1g.6gb+me", 0, 1, gi_id=1, busy=True),)
    engine = MigEngine([MigNode("n", 64000, 262144, (Card(0, A30.model, A30, mig=True, instances=held),))])
    assert isinstance(engine.place_one(SliceDemand("d", profile="2g.12gb+me")), MigPending)
    assert isinstance(engine.place_one(SliceDemand("e", profile="2g.12gb")), MigBinding)


def test_geometry_validation_states_the_media_rule():
    from dataclasses import replace

    me = A30.profile("2g.12gb+me")
    twice = replace(A30, profiles=tuple(replace(me, max_instances=2) if p is me else p for p in A30.profiles))
    assert geometry_problems(twice) == [
        "2g.12gb+me: 2 instances, but a card has one set of media engines (JPEG/OFA): at most one +me instance of "
        "any size"
    ]


# ---------------------------------------------------------------------------------------------------- properties


@st.composite
def cards_with_leftovers(draw):
    """A node of MIG cards, each with idle instances earlier work left (a valid layout, named by GPU instance id),
    and a sequence of demands and releases."""
    cards = []
    for j in range(draw(st.integers(1, 3))):
        geometry = SEEDED[draw(st.sampled_from(sorted(SEEDED)))]
        layout: list = []
        for profile in draw(st.lists(st.sampled_from(geometry.profiles), max_size=6)):
            start = draw(st.sampled_from(profile.starts))
            candidate = [*layout, (profile.name, start, profile.memory_slices)]
            if not layout_problems(geometry, candidate):
                layout = candidate
        instances = tuple(Instance(n, s, z, gi_id=k + 1, ci_id=0) for k, (n, s, z) in enumerate(layout))
        cards.append(Card(j, geometry.model, geometry, mig=True, instances=instances))
    profiles = sorted({p.name for card in cards for p in card.geometry.profiles})
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("slice"), st.sampled_from(profiles)),
                st.tuples(st.just("whole"), st.just("")),
                st.tuples(st.just("release"), st.just("")),
            ),
            min_size=1,
            max_size=12,
        )
    )
    return MigNode("n", 64000, 262144, tuple(cards)), steps


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cards_with_leftovers())
def test_every_plan_runs_on_the_card_and_the_layout_stays_valid(scenario):
    """Whatever idle instances earlier work left, each placement's plan runs on a fake card holding them (running
    work in the held ones) and the card's instances afterwards are exactly what the engine believes: held plus the
    idle ones it did not destroy, a valid layout."""
    node, steps = scenario
    engine = MigEngine([node])
    host = FakeHost(*(FakeGpu(card.index, card.geometry, mig_mode=True) for card in node.cards))
    for card in node.cards:
        for instance in card.instances:
            host.add_instance(card.index, instance.profile, instance.start, instance.gi_id)
    held: list[MigBinding] = []
    for n, (kind, profile) in enumerate(steps):
        if kind == "release":
            if held:
                released = held.pop(0)
                engine.release(released)
                for placed in released.placed:  # the created instance goes with the work, a reused one stays
                    gpu = host.gpus[placed.card]
                    if placed.instance is not None and placed.create:
                        gi = next(g for g, i in gpu.instances.items() if i.start == placed.instance.start)
                        host.run_all(
                            [["nvidia-smi", "mig", "-i", str(placed.card), "-gi", str(gi), c] for c in ("-dci",)]
                            + [["nvidia-smi", "mig", "-i", str(placed.card), "-dgi", "-gi", str(gi)]]
                        )
            continue
        outcome = engine.place_one(SliceDemand(f"d{n}", profile=profile or None))
        if not isinstance(outcome, MigBinding):
            continue
        held.append(outcome)
        for placed in outcome.placed:
            gpu = host.gpus[placed.card]
            card = node.cards[placed.card]
            profile_row = card.geometry.profile(placed.instance.profile) if placed.instance else None
            gi_ids = [next(g for g, i in gpu.instances.items() if i.start == gone.start) for gone in placed.destroy]
            host.run_all(
                host_commands(
                    placed.card,
                    destroy=gi_ids,
                    mode=placed.mode,
                    create=(profile_row.profile_id, placed.instance.start) if placed.create else None,
                )
            )
    for j, card in enumerate(node.cards):
        state = engine.cards[0][j]
        believed = (
            sorted([*state[4], *((i.profile, i.start, i.size) for i in engine._idle(0, j))])
            if state[0] == "m"
            else None
        )
        if believed is not None:
            assert host.gpus[j].layout() == believed
        assert layout_problems(card.geometry, host.gpus[j].layout()) == []
