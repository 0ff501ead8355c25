"""Expected starts of work that is not queued yet: an order in the preview ("if submitted now") and the requests in an
approval inbox ("if approved now"). The same replay as the cycle's (scheduling/forecasting.py), from what the last
cycle stored with its outcome (running work with its ends, the queue's head with its ranks, the early-end ratios) on
the engine state it left, with the new work put where the queue order would put it: behind every queued request
ranked as high or higher (it is the newest), ahead of the rest.

No query of its own: the outcome is read (and decoded once per process and cycle) for the preview anyway. The replay
stops once the new work is placed. Before any cycle there is no picture to replay from: no estimate.

An order's preview is replayed once per process and cycle for each shape (`order_expected_start`): the order form
asks again on every change, mostly for the catalog's few specs, and behind a long queue one replay (the whole queue
ahead placed, in several draws) takes most of a second, while the answer from one cycle's picture does not change."""

import dataclasses
from datetime import datetime

from django.utils import timezone

from catalog.models import ResourceSpec
from requests.models import ResourceRequest
from scheduling import forecasting
from scheduling.cycle import make_demand
from scheduling.engine import Demand
from scheduling.engine.forecast import Queued
from scheduling.outcome import Outcome, last_outcome

_decoded: dict[datetime, forecasting.Inputs] = {}  # the last outcome's inputs this process decoded, by its time
# The last outcome's order previews this process replayed: (outcome's time, the demand without its id, hours) -> data.
_previewed: dict[tuple[datetime, Demand, float], dict | None] = {}
PREVIEWS_KEPT = 256  # shapes a process keeps per cycle; past that it forgets them all (a new cycle does anyway)


def expected_starts(new: list[tuple[Demand, float]], outcome: Outcome | None) -> dict[str, dict]:
    """{demand id: estimate data} for each new demand with its duration in hours, as if queued now together (in
    the given order among equals), replayed from the last cycle's `outcome`."""
    if not new or outcome is None or not outcome.forecast:
        return {}
    inputs = decoded_inputs(outcome)
    queue = [queued for queued, _rank in inputs.queue]
    ranks = [rank for _queued, rank in inputs.queue]
    for demand, hours in new:
        at = next((i for i, rank in enumerate(ranks) if rank < demand.priority), len(ranks))
        queue.insert(at, Queued(demand, hours))
        ranks.insert(at, demand.priority)
    return forecasting.replay(
        engine_now=lambda: outcome.engine_for(new[0][0]),
        inputs=inputs,
        queue=queue,
        now=timezone.now(),
        wanted={demand.id for demand, _hours in new},
    )


def order_expected_start(demand: Demand, hours: float, outcome: Outcome | None) -> dict | None:
    """The expected start of one order "if submitted now" (`expected_starts`), the same for every order of its shape
    and term until the next cycle."""
    if outcome is None:
        return None
    key = (outcome.finished_at, dataclasses.replace(demand, id=""), hours)
    if key not in _previewed:
        if len(_previewed) >= PREVIEWS_KEPT or next(iter(_previewed), key)[0] != outcome.finished_at:
            _previewed.clear()  # all kept are of one cycle's picture
        _previewed[key] = expected_starts([(demand, hours)], outcome).get(demand.id)
    return _previewed[key]


def forget_pictures() -> None:
    """Forget the outcomes this process decoded and the previews it replayed (tests with a frozen clock: two cycles
    of one moment)."""
    _decoded.clear()
    _previewed.clear()


def decoded_inputs(outcome: Outcome) -> forecasting.Inputs:
    """The outcome's stored forecast inputs, decoded once per process and cycle."""
    if outcome.finished_at not in _decoded:
        _decoded.clear()
        _decoded[outcome.finished_at] = forecasting.from_stored(outcome.forecast)
    return _decoded[outcome.finished_at]


def starts_if_approved(request_ids: list[int]) -> dict[int, dict]:
    """{request id: estimate data} of requests awaiting approval, as if all were approved now (two reads for the
    requests and their accelerator models, one for the last cycle's outcome). Serving deployments are left out: their
    replicas' shape comes with the approved snapshot."""
    order = {request_id: i for i, request_id in enumerate(request_ids)}
    rows = sorted(
        ResourceRequest.objects.filter(pk__in=request_ids, serving_model__isnull=True).values_list(
            "pk",
            "priority",
            "cpu_cores",
            "memory_gb",
            "accelerator_count",
            "duration_hours",
            "spec_id",
            "spec__slice_profile__name",
            "bare_metal_profile__accelerator_model__slug",
        ),
        key=lambda row: order[row[0]],  # in the inbox's order: the earlier one is approved first
    )
    models: dict[int, set[str]] = {}
    for spec_id, slug in ResourceSpec.accelerator_models.through.objects.filter(
        resourcespec_id__in={row[6] for row in rows if row[6]}
    ).values_list("resourcespec_id", "acceleratormodel__slug"):
        models.setdefault(spec_id, set()).add(slug)
    new = [
        (
            make_demand(
                str(pk),
                priority,
                cpu_cores=cpu_cores,
                memory_gb=memory_gb,
                count=count,
                models=frozenset(models.get(spec_id, ()) if spec_id else {profile_model}),
                slice_profile=slice_profile,
            ),
            float(hours),
        )
        for pk, priority, cpu_cores, memory_gb, count, hours, spec_id, slice_profile, profile_model in rows
    ]
    return {int(demand_id): data for demand_id, data in expected_starts(new, last_outcome()).items()}
