"""The order preview's "would it fit now?": the queue ahead of the order is placed first, then the order."""

from requests.choices import PRIORITY_RANK, RequestState
from requests.models import ResourceRequest
from scheduling import placement
from scheduling.cycle import demand_of, load_snapshot, make_demand, queue_order

PREVIEW_ID = "preview"


def order_demand(order, sizing) -> placement.Demand:
    """The engine's view of an order that is not stored yet (the same shape a queued request would have)."""
    sizes = {"cpu_cores": sizing.cpu_cores, "memory_gb": sizing.memory_gb}
    if order.bare_metal_profile is not None:
        profile = order.bare_metal_profile
        return make_demand(PREVIEW_ID, order.priority, count=profile.accelerator_count,
                           models=frozenset([profile.accelerator_model.slug]), **sizes)
    spec = order.spec
    return make_demand(PREVIEW_ID, order.priority, count=sizing.accelerator_count,
                       slice_profile=spec.slice_profile.name if spec.slice_profile else None,
                       models=frozenset(model.slug for model in spec.accelerator_models.all()), **sizes)


def placement_estimate(order, sizing) -> dict:
    demand = order_demand(order, sizing)
    ahead = [request for request in queue_order(list(ResourceRequest.objects.filter(state=RequestState.QUEUED)))
             if PRIORITY_RANK[request.priority] >= demand.priority]
    engine = placement.PlacementEngine(load_snapshot().snapshot, workload=[demand])
    engine.place([demand_of(request) for request in ahead])
    outcome = engine.place_one(demand)
    if isinstance(outcome, placement.Pending):
        return {"fits_now": False, "queued_ahead": len(ahead), "code": outcome.reason,
                "message": f"Would queue behind {len(ahead)} request(s): {outcome.message}."}
    node = outcome[0].node
    return {"fits_now": True, "queued_ahead": len(ahead), "node": node, "code": None,
            "message": f"Fits now on {node}" + (f", after the {len(ahead)} request(s) ahead." if ahead else ".")}
