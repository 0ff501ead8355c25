"""Reads of inventory and capacity, each in a constant number of queries however large the cluster."""

from datetime import timedelta
from decimal import Decimal

from django.db.models import Count, F, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce

from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling.choices import AllocationState, DeviceHealth
from scheduling.engine import MILLI
from scheduling.models import UNPLACED_RACK, Allocation, AllocationDevice, Device, MigInstance, Node

# A device the scheduler may place on: not isolated, not unhealthy, on a schedulable node.
PLACEABLE = Q(isolated=False, node__schedulable=True) & ~Q(health=DeviceHealth.UNHEALTHY)


def replicas_serving_without(*, device_id: int) -> QuerySet[Allocation]:
    """Active replica allocations that do not hold the device: a serving request with one of these keeps serving
    when the device fails, only its replica there leaves the rotation (the request is not requeued)."""
    return Allocation.objects.filter(state=AllocationState.ACTIVE, replica__isnull=False).exclude(
        devices__device_id=device_id
    )


def _cards(milli: int | None) -> Decimal:
    return (Decimal(milli or 0) / MILLI).quantize(Decimal("0.001"))


def capacity_by_model() -> list[dict]:
    """Per accelerator model: devices in total, healthy, isolated; cards allocated (from milli-shares) and free
    (unallocated shares on placeable devices), free also as people count cards (with nothing on them, partly used);
    cards in MIG mode and their GPU instances per profile. Three queries."""
    rows = (
        Device.objects.values("model_id", "model__slug", "model__name", "model__vendor__name", "model__memory_gb")
        .annotate(
            n_total=Count("id"),
            n_healthy=Count("id", filter=Q(health=DeviceHealth.HEALTHY)),
            n_isolated=Count("id", filter=Q(isolated=True)),
            allocated_sum=Sum("allocated_milli"),
            free_sum=Sum(Value(MILLI) - F("allocated_milli"), filter=Q(PLACEABLE)),
            n_free_whole=Count("id", filter=Q(PLACEABLE) & Q(allocated_milli=0)),
            n_partly_free=Count("id", filter=Q(PLACEABLE) & Q(allocated_milli__gt=0, allocated_milli__lt=MILLI)),
        )
        .order_by("model__vendor__name", "model__name")
    )
    mig = mig_capacity_by_model()
    return [
        {
            **mig.get(row["model_id"], {"mig_mode_devices": 0, "mig_instances": []}),
            "model_id": row["model_id"],
            "slug": row["model__slug"],
            "name": row["model__name"],
            "vendor": row["model__vendor__name"],
            "memory_gb": row["model__memory_gb"],
            "total": row["n_total"],
            "healthy": row["n_healthy"],
            "isolated": row["n_isolated"],
            "allocated": _cards(row["allocated_sum"]),
            "free": _cards(row["free_sum"]),
            # As a person counts free cards: those with nothing on them, and those with a share or slice in use.
            "free_whole": row["n_free_whole"],
            "partly_free": row["n_partly_free"],
        }
        for row in rows
    ]


NO_RACK = "(no rack)"
NO_BLOCK = "(no block)"


def capacity_by_domain() -> list[dict]:
    """The topology tree site > block > rack with free whole cards per accelerator model in each domain (what a
    multi-node gang can take: placeable cards with nothing on them) and the nodes and cards in it. One query.

    [{name, free, cards, nodes, models: {model name: free}, blocks: [{name, ..., racks: [{name, ...}]}]}]; nodes
    without a rack (or in the import's placeholder rack) are listed as NO_RACK, racks without a block as NO_BLOCK."""
    rows = (
        Device.objects.values("node__rack__site__name", "node__rack__block__name", "node__rack__name", "model__name")
        .annotate(
            cards=Count("id"),
            nodes=Count("node_id", distinct=True),
            free=Count("id", filter=Q(PLACEABLE) & Q(allocated_milli=0)),
        )
        .order_by("node__rack__site__name", "node__rack__block__name", "node__rack__name", "model__name")
    )
    sites: dict[str, dict] = {}
    for row in rows:
        rack = row["node__rack__name"]
        path = (
            row["node__rack__site__name"] or NO_RACK,
            row["node__rack__block__name"] or NO_BLOCK,
            NO_RACK if rack in (None, UNPLACED_RACK) else rack,
        )
        site = sites.setdefault(path[0], _domain(path[0], "blocks"))
        block = _child(site, "blocks", path[1], "racks")
        for domain in (site, block, _child(block, "racks", path[2], None)):
            domain["free"] += row["free"]
            domain["cards"] += row["cards"]
            domain["nodes"] += row["nodes"]
            domain["models"][row["model__name"]] = domain["models"].get(row["model__name"], 0) + row["free"]
    return [_listed(site) for site in sites.values()]


def _domain(name: str, children: str | None) -> dict:
    return {"name": name, "free": 0, "cards": 0, "nodes": 0, "models": {}, **({children: {}} if children else {})}


def _child(parent: dict, children: str, name: str, grandchildren: str | None) -> dict:
    return parent[children].setdefault(name, _domain(name, grandchildren))


def _listed(domain: dict) -> dict:
    """The tree with its children as lists (a template loops over them)."""
    out = dict(domain)
    for key in ("blocks", "racks"):
        if key in out:
            out[key] = [_listed(child) for child in out[key].values()]
    return out


def nodes_with_capacity() -> QuerySet[Node]:
    """Nodes annotated with device_count, allocated_milli and free_milli (placeable shares), rack and site joined."""
    placeable = Q(devices__isolated=False) & ~Q(devices__health=DeviceHealth.UNHEALTHY)
    return Node.objects.select_related("rack__site").annotate(
        device_count=Count("devices"),
        allocated_milli=Coalesce(Sum("devices__allocated_milli"), 0),
        free_milli=Coalesce(Sum(Value(MILLI) - F("devices__allocated_milli"), filter=placeable), 0),
    )


def devices_with_relations() -> QuerySet[Device]:
    return Device.objects.select_related("node", "model__vendor").prefetch_related("mig_instances__profile")


def mig_capacity_by_model() -> dict[int, dict]:
    """Per accelerator model: cards in MIG mode and GPU instances by profile, free and held. One query."""
    rows = (
        MigInstance.objects.values("device__model_id", "profile__name", "profile__compute_slices")
        .annotate(n=Count("id"), held=Count("id", filter=Q(allocation__isnull=False)))
        .order_by("device__model_id", "profile__compute_slices", "profile__name")
    )
    modes = Device.objects.filter(mig_mode=True).values("model_id").annotate(n=Count("id")).order_by("model_id")
    out: dict[int, dict] = {row["model_id"]: {"mig_mode_devices": row["n"], "mig_instances": []} for row in modes}
    for row in rows:
        entry = out.setdefault(row["device__model_id"], {"mig_mode_devices": 0, "mig_instances": []})
        entry["mig_instances"].append(
            {"profile": row["profile__name"], "total": row["n"], "held": row["held"], "free": row["n"] - row["held"]}
        )
    return out


def running_requests_on(*, node_ids: list[int] | None = None, device_ids: list[int] | None = None) -> list[dict]:
    """The requests holding an active allocation on these nodes or devices, with their owners and the cards they
    hold there (one query): the blast radius an operator sees before cordoning or isolating."""
    bindings = AllocationDevice.objects.filter(allocation__state=AllocationState.ACTIVE)
    if node_ids is not None:
        bindings = bindings.filter(allocation__node_id__in=node_ids)
    if device_ids is not None:
        bindings = bindings.filter(device_id__in=device_ids)
    rows: dict[int, dict] = {}
    for binding in bindings.select_related(
        "allocation__request__requester", "allocation__request__project", "allocation__node", "device"
    ).order_by("allocation__request_id", "device__index"):
        request = binding.allocation.request
        row = rows.setdefault(
            request.pk,
            {
                "request": request,
                "owner": request.requester.username,
                "project": request.project.name,
                "node": binding.allocation.node.name,
                "devices": [],
                "replicas": [],  # a serving request's replicas there (each holds an allocation of its own)
            },
        )
        row["devices"].append(f"gpu{binding.device.index}")
        if binding.allocation.replica is not None and binding.allocation.replica not in row["replicas"]:
            row["replicas"].append(binding.allocation.replica)
    return list(rows.values())


def queued_demand_by_model() -> dict[int, dict]:
    """Per accelerator model: the cards (whole-card equivalents) and the number of queued requests waiting for it; a
    spec open to several models counts under each (two queries)."""
    queued = ResourceRequest.objects.filter(state=RequestState.QUEUED)
    demand: dict[int, dict] = {}
    for path in ("spec__accelerator_models", "bare_metal_profile__accelerator_model"):
        rows = (
            queued.filter(**{f"{path}__isnull": False})
            .values(model_id=F(path), name=F(f"{path}__name"))
            .annotate(cards=Sum("gpu_equivalents"), requests=Count("id"))
            .order_by()
        )
        for row in rows:
            entry = demand.setdefault(row["model_id"], {"name": row["name"], "cards": Decimal(0), "requests": 0})
            entry["cards"] += row["cards"]
            entry["requests"] += row["requests"]
    return demand


def early_end_ratios(*, limit: int) -> list[tuple[tuple[int, int, int, int], float]]:
    """How much of its approved term ended work used (actual / approved duration), with the work's kind (cards,
    cores, memory, approved hours), for the `limit` terms that started last (one indexed read): the forecast's
    measure of how early work ends. Preempted work is left out: it did not end by itself."""
    terms = (
        Allocation.objects.filter(state=AllocationState.RELEASED, preempted_for__isnull=True)
        .order_by("-term_started_at")
        .values_list(
            "term_started_at",
            "released_at",
            "request__duration_hours",
            "request__accelerator_count",
            "cpu_milli",
            "memory_mib",
        )[:limit]
    )
    return [
        ((cards, cpu_milli, memory_mib, hours), (released - started).total_seconds() / (hours * 3600))
        for started, released, hours, cards, cpu_milli, memory_mib in terms
        if hours > 0
    ]


# Advance reservations the calendar shows: awaiting approval, held, or running their window.
CALENDAR_STATES = (
    RequestState.PENDING_APPROVAL,
    RequestState.APPROVED,
    RequestState.QUEUED,
    RequestState.ALLOCATED,
    RequestState.PROVISIONING,
    RequestState.ACTIVE,
)
NO_SITE = "(no site yet)"


def reservation_calendar(*, now) -> list[dict]:
    """The advance reservations whose window has not ended, grouped per accelerator model and site, each group in
    start order: [{model, site, reservations: [{id, project, state, start, end, nodes}]}]. The site is the planned
    nodes' (each cycle plans them: the queue reason's numbers) or, once running, the allocation's. Three queries."""
    rows = [
        row
        for row in ResourceRequest.objects.filter(state__in=CALENDAR_STATES, reserved_start__isnull=False)
        .order_by("reserved_start", "pk")
        .values("pk", "state", "reserved_start", "duration_hours", "project__slug", "spec__name", "queue_reason")
        if row["reserved_start"] + timedelta(hours=row["duration_hours"]) > now
    ]
    running = {}
    for request_id, node in Allocation.objects.filter(
        request_id__in=[row["pk"] for row in rows], state=AllocationState.ACTIVE
    ).values_list("request_id", "node__name"):
        running.setdefault(request_id, set()).add(node)
    nodes = {row["pk"]: sorted(running.get(row["pk"]) or _planned(row)) for row in rows}
    sites = dict(
        Node.objects.filter(name__in={name for names in nodes.values() for name in names}).values_list(
            "name", "rack__site__name"
        )
    )
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        site = ", ".join(sorted({sites.get(name) or NO_SITE for name in nodes[row["pk"]]})) or NO_SITE
        groups.setdefault((row["spec__name"] or "", site), []).append(
            {
                "id": row["pk"],
                "project": row["project__slug"],
                "state": RequestState(row["state"]).label,
                "start": row["reserved_start"],
                "end": row["reserved_start"] + timedelta(hours=row["duration_hours"]),
                "nodes": nodes[row["pk"]],
            }
        )
    return [
        {"spec": spec, "site": site, "reservations": reservations}
        for (spec, site), reservations in sorted(groups.items())
    ]


def _planned(row: dict) -> list[str]:
    reason = row["queue_reason"] if isinstance(row["queue_reason"], dict) else {}
    return list((reason.get("numbers") or {}).get("nodes") or [])


def domains_of(names: set[str]) -> dict[str, str]:
    """{node: its topology domain} of every node in the domains of these nodes, theirs included (one query)."""
    domains = Node.objects.filter(name__in=names).values("topology_domain")
    return dict(Node.objects.filter(topology_domain__in=domains).values_list("name", "topology_domain"))


def node_failures(names: set[str]) -> dict[str, str]:
    """{node: why no work may go there, in words} for these nodes: cordoned, or its cards isolated or not healthy
    (two queries). A node missing here is gone from the inventory, or fine."""
    why: dict[str, list[str]] = {}
    for name, schedulable, reason in Node.objects.filter(name__in=names).values_list(
        "name", "schedulable", "cordon_reason"
    ):
        why[name] = [] if schedulable else [f"cordoned: {reason}"]
    for name, index, health, detail, isolated, isolation in (
        Device.objects.filter(node__name__in=names)
        .exclude(health=DeviceHealth.HEALTHY, isolated=False)
        .order_by("node__name", "index")
        .values_list("node__name", "index", "health", "health_detail", "isolated", "isolation_reason")
    ):
        said = f"gpu{index} isolated: {isolation}" if isolated else f"gpu{index} {health}: {detail or 'no detail'}"
        why.setdefault(name, []).append(said)
    return {name: "; ".join(words) for name, words in why.items() if words}
