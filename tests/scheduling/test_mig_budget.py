"""The partition budget (scheduling/mig/budget.py): slices partition no more MIG-capable cards than their requested
share of the demand gives them, so whole-card work finds empty cards; and the MIG benchmark's mapping honours each
pod's GPU-model constraint."""

from bench.mig import demand_of
from bench.traces import Pod
from scheduling.mig import SEEDED, Card, DemandMix, MigBinding, MigEngine, MigNode, MigPending, SliceDemand

H100 = SEEDED["H100 80GB"]
CAPABLE = frozenset({"H100 80GB"})


def test_slices_get_their_requested_share_of_the_cluster():
    mix = DemandMix(capable=4, plain=0, capable_models=CAPABLE)
    assert mix.budget is None  # nothing else asks for cards: no budget
    mix.see(SliceDemand("a", profile="7g.80gb"), 650)  # a 0.65 share rounds up to a whole card
    mix.see(SliceDemand("b", profile="4g.40gb"), 470)
    assert mix.budget is None
    mix.see(SliceDemand("w"), 0)  # one whole card asked for
    # 4 cards x 1.12 / (1.12 + 1): slices may partition 2, two stay for whole cards
    assert mix.budget == 2


def test_demand_that_cannot_use_a_mig_card_leaves_them_to_slices():
    mix = DemandMix(capable=2, plain=2, capable_models=CAPABLE)
    mix.see(SliceDemand("a", profile="3g.40gb"), 500)
    mix.see(SliceDemand("t4", count=2, models=frozenset({"T4"})), 0)  # plain cards only
    assert mix.budget is None
    mix.see(SliceDemand("w", count=1), 0)
    # scaled to the cluster's 4 cards: the T4 demand fills the 2 plain cards, the whole card needs a MIG-capable one
    assert mix.budget == round(2 - 4 / 3.5)


def test_a_spent_budget_keeps_slices_on_partitioned_cards_and_says_so():
    cards = tuple(Card(j, H100.model, H100, mig=True) for j in range(2))
    engine = MigEngine([MigNode("n7", 64000, 262144, cards)], partition_budget=1)
    first = engine.place_one(SliceDemand("a", profile="4g.40gb"))
    assert isinstance(first, MigBinding) and engine.partitioned == 1
    beside = engine.place_one(SliceDemand("b", profile="3g.40gb"))
    assert isinstance(beside, MigBinding) and beside.placed[0].card == first.placed[0].card
    waiting = engine.place_one(SliceDemand("c", profile="4g.40gb"))
    assert isinstance(waiting, MigPending) and waiting.reason == "capacity_in_use"
    assert waiting.numbers == {"profile": "4g.40gb", "partitioned": 1, "partition_budget": 1}
    assert isinstance(engine.place_one(SliceDemand("w")), MigBinding)  # the empty card is the whole card's
    engine.partition_budget = None
    engine.release(first)
    assert isinstance(engine.place_one(SliceDemand("c", profile="4g.40gb")), MigBinding)


def test_the_benchmark_honours_each_pods_gpu_model_constraint():
    def pod(num, milli, spec=""):
        return Pod("p", 4000, 8192, num, milli, frozenset(m for m in spec.split("|") if m))

    anywhere = demand_of(pod(1, 470), 0)
    assert (anywhere.profile, anywhere.models) == ("4g.40gb", frozenset({"H100 80GB", "A100 80GB"}))
    g2_or_t4 = demand_of(pod(1, 470, "G2|T4"), 0)
    assert (g2_or_t4.profile, g2_or_t4.models) == ("4g.40gb", frozenset({"H100 80GB"}))
    t4_only = demand_of(pod(1, 470, "T4"), 0)
    assert (t4_only.profile, t4_only.share, t4_only.models) == (None, 470, frozenset({"T4"}))
    whole = demand_of(pod(2, 1000, "G3|V100M32"), 0)
    assert (whole.count, whole.profile, whole.models) == (2, None, frozenset({"A100 80GB", "V100M32"}))
