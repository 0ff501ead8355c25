"""The order preview's "would it fit now?" (the queue ahead of the order is placed first, then the order) and the
submission's "could it ever fit?" (against the inventory alone)."""

from requests.choices import PRIORITY_RANK, RequestState
from requests.models import ResourceRequest
from scheduling import placement
from scheduling.cycle import demand_of, load_inventory, load_snapshot, make_demand, queue_order

PREVIEW_ID = "preview"


def order_demand(order, sizing) -> placement.Demand:
    """The engine's view of an order that is not stored yet (the same shape a queued request would have)."""
    sizes = {"cpu_cores": sizing.cpu_cores, "memory_gb": sizing.memory_gb}
    if order.bare_metal_profile is not None:
        profile = order.bare_metal_profile
        return make_demand(
            PREVIEW_ID,
            order.priority,
            count=profile.accelerator_count,
            models=frozenset([profile.accelerator_model.slug]),
            **sizes,
        )
    spec = order.spec
    return make_demand(
        PREVIEW_ID,
        order.priority,
        count=sizing.accelerator_count,
        slice_profile=spec.slice_profile.name if spec.slice_profile else None,
        models=frozenset(model.slug for model in spec.accelerator_models.all()),
        **sizes,
    )


def placement_estimate(order, sizing) -> dict:
    """Whether the order fits now behind the queue ahead of it, or why not; `never_fits` when no node of the
    inventory could hold it even empty (then the queue is not even looked at)."""
    demand = order_demand(order, sizing)
    cluster = load_snapshot()
    never = placement.unplaceable(cluster.snapshot.nodes, demand)
    if never is not None:
        return {
            "fits_now": False,
            "never_fits": True,
            "queued_ahead": None,
            "code": never.reason,
            "message": _sentence(never.message),
            "details": dict(never.numbers),
        }
    ahead = [
        request
        for request in queue_order(list(ResourceRequest.objects.filter(state=RequestState.QUEUED)))
        if PRIORITY_RANK[request.priority] >= demand.priority
    ]
    engine = placement.PlacementEngine(cluster.snapshot, workload=[demand])
    engine.place([demand_of(request) for request in ahead])
    outcome = engine.place_one(demand)
    if isinstance(outcome, placement.Pending):
        return {
            "fits_now": False,
            "never_fits": False,
            "queued_ahead": len(ahead),
            "code": outcome.reason,
            "message": f"Would queue behind {len(ahead)} request(s): {outcome.message}.",
            "details": dict(outcome.numbers),
        }
    node = outcome[0].node
    return {
        "fits_now": True,
        "never_fits": False,
        "queued_ahead": len(ahead),
        "node": node,
        "code": None,
        "message": f"Fits now on {node}" + (f", after the {len(ahead)} request(s) ahead." if ahead else "."),
    }


def order_never_fits(order, sizing) -> dict | None:
    """The submission's check ({code, message, details}) when no node of the inventory could ever hold the order;
    None when one could. Three queries: the inventory, not what runs on it."""
    never = placement.unplaceable(load_inventory(), order_demand(order, sizing))
    if never is None:
        return None
    return {"code": never.reason, "message": _sentence(never.message), "details": dict(never.numbers)}


def _sentence(reason: str) -> str:
    """An engine reason ("needs ...; ...") as a sentence of its own."""
    return f"{reason[:1].upper()}{reason[1:]}."
