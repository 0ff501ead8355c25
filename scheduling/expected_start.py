"""Expected starts of work that is not queued yet: an order in the preview ("if submitted now") and the requests in an
approval inbox ("if approved now"). The same forecast as the cycle's (scheduling/forecasting.py), with the new work
put where the queue order would put it: behind every queued request of its class or higher (it is the newest),
ahead of the lower classes.

It reads the cluster whole (the cycle's five snapshot queries), the queue's order keys, the first
SCHEDULER_FORECAST_QUEUE rows in that order and the early-end history: a constant number of queries for any number of
new requests, which is why the inbox asks once for all its rows."""

from django.conf import settings
from django.utils import timezone

from catalog.models import ResourceSpec
from requests.models import ResourceRequest
from scheduling import forecasting
from scheduling.cycle import aged_rank, demand_of, load_snapshot, make_demand, queue_order, queued_keys
from scheduling.engine import Demand, PlacementEngine
from scheduling.queued_rows import Queued, UnseenRows


def expected_starts(new: list[tuple[Demand, float]], *, rows=None) -> dict[str, dict]:
    """{demand id: estimate data} for each new demand with its duration in hours, as if queued now together (in
    the given order within a class). `rows` reads queued requests' rows by their keys (default: from the
    database; the preview passes the rows its process keeps)."""
    if not new or not settings.SCHEDULER_FORECAST_QUEUE:
        return {}
    now = timezone.now()
    ahead = _queue_head(settings.SCHEDULER_FORECAST_QUEUE, rows or UnseenRows().rows)
    queue = [(demand_of(request), float(request.duration_hours)) for request in ahead]
    ranks = [aged_rank(request.priority, request.created_at, now) for request in ahead]
    for demand, hours in new:  # behind every request ranked as high or higher, ahead of the rest
        at = next((i for i, rank in enumerate(ranks) if rank < demand.priority), len(ranks))
        queue.insert(at, (demand, hours))
        ranks.insert(at, demand.priority)
    cluster = load_snapshot()
    start = PlacementEngine(cluster.snapshot, workload=[demand for demand, _hours in queue])
    return forecasting.expected(
        engine_now=start.fork,
        allocations=cluster.snapshot.allocations,
        expires=cluster.expires,
        queue=queue,
        now=now,
        wanted={demand.id for demand, _hours in new},
    )


def _queue_head(limit: int, rows) -> list[Queued]:
    """The first `limit` queued requests in queue order: their order keys read whole, then only their rows."""
    keys = queued_keys()
    return rows([(key.pk, key.priority, key.created_at) for key in queue_order(keys)[:limit]])


def starts_if_approved(request_ids: list[int]) -> dict[int, dict]:
    """{request id: estimate data} of requests awaiting approval, as if all were approved now (two reads for the
    requests and their accelerator models, then `expected_starts`). Serving deployments are left out: their replicas'
    shape comes with the approved snapshot."""
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
    return {int(demand_id): data for demand_id, data in expected_starts(new).items()}
