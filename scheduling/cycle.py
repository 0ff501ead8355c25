"""The scheduling cycle: queued requests -> placement engine -> allocations, in one transaction.

One cycle at a time cluster-wide (PostgreSQL advisory lock held for the transaction). The snapshot, the queue
and the writes each take a fixed number of queries, however many nodes and requests there are.

No trigger is lost to a running cycle: a cycle that finds the lock taken leaves a wake-up (a PostgreSQL sequence,
advanced outside any transaction so every session sees it at once) and returns `ran=False`; the running cycle
reads the sequence when it takes the lock and again after it has committed, and runs once more when it moved, so
what arrived after its queue read is placed at once instead of at the minute safety net.
"""

import gc
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Min
from django.utils import timezone

from catalog.runtimes import needs_of, needs_text
from config.words import counted
from requests.choices import PRIORITY_RANK, PriorityClass, RequestState
from requests.models import ResourceRequest
from requests.quota import month_start
from requests.services import requests_allocate, requests_note_queue, requests_note_replans
from scheduling import backends, cluster_state, forecasting, kept_engine, preemption, reservations, selectors
from scheduling.allocations import adjust_device_shares
from scheduling.engine import (
    NO_MATCHING_SPEC,
    Binding,
    Demand,
    NodeView,
    Snapshot,
    backfill,
    gang_split,
    spread_note,
    with_domain_frees,
)
from scheduling.mig import cycle as mig_cycle
from scheduling.models import Allocation, AllocationDevice
from scheduling.outcome import record_outcome
from scheduling.reason_words import namer
from scheduling.signals import cycle_finished, requests_allocated
from tenancy.choices import QuotaDimension
from tenancy.models import MonthlyUsage, ProjectQuota

logger = logging.getLogger(__name__)

CYCLE_LOCK_ID = 0x5C4ED  # any constant shared by every worker
WAKEUP_SEQUENCE = "scheduling_cycle_wakeup"  # created by migration 0009; advanced by cycles that met a running one
QUOTA_EXHAUSTED = "quota_exhausted"
HOLDING_STATES = [RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE, RequestState.RELEASING]


@dataclass
class CycleResult:
    ran: bool
    allocated: list[int] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)  # request id -> reason code
    preempted: list[int] = field(default_factory=list)  # requests preempted (back in the queue) by this cycle
    wakeups: int = 0  # the wake-up sequence as this cycle saw it when it took the lock

    def followed_by(self, later: "CycleResult") -> "CycleResult":
        """This cycle and the one it ran after itself, as one result (the later one says who still waits)."""
        return CycleResult(
            ran=True,
            allocated=self.allocated + later.allocated,
            waiting=later.waiting,
            preempted=self.preempted + later.preempted,
            wakeups=later.wakeups,
        )


def _take_cycle_lock() -> bool:
    if connection.vendor != "postgresql":
        return True  # the embedded SQLite demo has one writer at a time anyway
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [CYCLE_LOCK_ID])
        return cursor.fetchone()[0]


def _wakeups() -> int:
    """How many wake-ups cycles that met a running one have left (0 on SQLite, where cycles never meet)."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {WAKEUP_SEQUENCE}")
        return cursor.fetchone()[0]


def _leave_wakeup() -> None:
    # nextval is never rolled back and is visible to every session at once, inside or outside a transaction.
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(%s)", [WAKEUP_SEQUENCE])


@dataclass
class ClusterSnapshot:
    """The engine's snapshot plus the way back from engine positions to database rows."""

    snapshot: Snapshot
    device_ids: dict[tuple[str, int], int]  # (node name, engine device position) -> Device.pk
    node_ids: dict[str, int]
    expires: dict[str, datetime]  # engine allocation id (request id) -> when it ends
    source: cluster_state.ClusterState | None = None  # the kept state it was read from (None: read whole for once)


def load_snapshot() -> ClusterSnapshot:
    """Nodes, devices, slice tables and running allocations read whole (five queries, plain rows: a 12,000-node
    fleet is 60,000 devices). The cycle itself uses the state its process keeps (`cluster_state.kept`)."""
    state = cluster_state.ClusterState()
    state.read_all()
    return ClusterSnapshot(*state.view())


def _kept_snapshot() -> ClusterSnapshot:
    """The cluster as the database has it now, from the state this process kept since its last cycle."""
    state = cluster_state.kept.current()
    return ClusterSnapshot(*state.view(), source=state)


def load_inventory() -> list[NodeView]:
    """The nodes with their devices as the engine sees them, without what runs on them."""
    state = cluster_state.ClusterState()
    state.read_inventory()
    return list(state.view()[0].nodes)


def make_demand(
    demand_id: str,
    priority_class: str,
    *,
    cpu_cores: int,
    memory_gb: int,
    count: int,
    models: frozenset,
    slice_profile: str | None = None,
    replicas: int = 1,
    serving: dict | None = None,
    nodes: int = 1,
    topology: dict | None = None,
) -> Demand:
    """The engine's demand for a request or an order: one shape for both, so the preview matches the cycle. With
    replicas (a serving deployment), `count`, `cpu_cores` and `memory_gb` are the totals the order reserved (spec x
    replicas): each replica is placed as its share, on a node of its own where there is room. `serving` (runtime,
    artifact_uri, model) makes it need what its runtime needs of a node (catalog.runtimes). With `nodes` > 1 (a
    multi-node spec) the totals are the gang's: each member gets its node's share, inside the spec's `topology`
    ({level, mode})."""
    needs = frozenset() if serving is None else needs_of(serving["runtime"], serving["artifact_uri"])
    parts = replicas * nodes
    topology = topology or {}
    gang_needs = frozenset({backends.MULTI_NODE_CAPABILITY}) if nodes > 1 else frozenset()
    return Demand(
        id=demand_id,
        count=count // parts,
        slice_profile=slice_profile,
        models=models,
        cpu_milli=cpu_cores * 1000 // parts,
        memory_mib=memory_gb * 1024 // parts,
        priority=PRIORITY_RANK[priority_class],
        preemptible=priority_class == PriorityClass.BATCH,
        replicas=replicas,
        needs=needs | gang_needs,  # a gang's members go only onto nodes whose backend runs one job of all of them
        needs_label=needs_text(serving["runtime"], serving["model"]) if needs else "",
        nodes=nodes,
        level=topology.get("level", "node"),
        mode=topology.get("mode", "required"),
    )


def serving_of(runtime: str, artifact_uri: str, model: str) -> dict:
    """What `make_demand` reads of a serving order, in the approved snapshot's words."""
    return {"runtime": runtime, "artifact_uri": artifact_uri, "model": model}


def demand_of(request: ResourceRequest) -> Demand:
    """The engine's view of a request, from its approved snapshot only."""
    spec, profile = request.approved_spec.get("spec"), request.approved_spec.get("bare_metal_profile")
    serving = request.approved_spec.get("serving") or {}
    sizes = {"cpu_cores": request.cpu_cores, "memory_gb": request.memory_gb}
    if profile is not None:
        return make_demand(
            str(request.pk),
            request.priority,
            count=profile["accelerator_count"],
            models=frozenset([profile["accelerator_model"]]),
            **sizes,
        )
    replicas, nodes = serving.get("replicas", 1), spec.get("nodes", 1)  # snapshots before multi-node specs: one
    if request.serving_replicas:  # an endpoint woken from zero asks for fewer replicas than it ordered, each as big
        sizes = {size: total * request.serving_replicas // replicas for size, total in sizes.items()}
        replicas = request.serving_replicas
    return make_demand(
        str(request.pk),
        request.priority,
        count=spec["accelerator_count"] * replicas * nodes,  # the snapshot's count is per node; the demand's, total
        slice_profile=spec["slice_profile"],
        models=frozenset(spec["accelerator_models"]),
        replicas=replicas,
        serving=serving or None,
        nodes=nodes,
        topology=spec.get("topology"),
        **sizes,
    )


def queue_order(requests: list[ResourceRequest]) -> list[ResourceRequest]:
    """Priority class first (highest first, after aging); with SCHEDULER_FAIR_SHARE, projects that used fewer
    card-hours this month go first within a class; then submission time."""
    usage = (
        _card_hours_this_month({request.project_id for request in requests}) if settings.SCHEDULER_FAIR_SHARE else {}
    )
    now = timezone.now()
    return sorted(
        requests,
        key=lambda request: (
            -aged_rank(request.priority, request.created_at, now),
            usage.get(request.project_id, 0),
            request.created_at,
            request.pk,
        ),
    )


# Aging goes up to this class and no further: an old batch request may overtake new standard and high work, never
# critical work (an operator's emergency lane).
AGED_CEILING = PriorityClass.HIGH
_CLASSES = sorted(PRIORITY_RANK, key=PRIORITY_RANK.get)  # lowest first


def aged_rank(priority: str, submitted_at: datetime, now: datetime) -> int:
    """The rank a request is ordered by: its class's, one class higher for every SCHEDULER_AGING_MINUTES it has
    waited since submission, up to AGED_CEILING (0 minutes: no aging). The fairness rule that bounds a wait: after
    at most (classes below the ceiling) x the aging step a request is ordered among the ceiling class by submission
    time, ahead of everything submitted after it; from then on it is the head of the queue as soon as those older
    ones are placed, and the head-of-line reservation (scheduling/engine/backfill.py) keeps its node from being
    filled by work behind it, so it starts once the allocations ahead of it end (their terms bound that)."""
    rank, step = PRIORITY_RANK[priority], settings.SCHEDULER_AGING_MINUTES
    ceiling = PRIORITY_RANK[AGED_CEILING]
    if not step or rank >= ceiling:
        return rank
    steps = int((now - submitted_at).total_seconds() // (step * 60))
    own = _CLASSES.index(priority)
    return PRIORITY_RANK[_CLASSES[min(own + steps, _CLASSES.index(AGED_CEILING))]]


@dataclass(frozen=True)
class _Queued:
    """What queue_order needs of a queued request, read for the whole queue without loading the rows."""

    pk: int
    priority: str
    project_id: int
    created_at: datetime


# What a cycle reads of a queued request: order keys, the approved snapshot and sizes, quota flags, queue status. The
# rest of the row (prices, free-form parameters, justification, foreign keys) is never read by a cycle and was about
# 40 % of loading the window's rows.
WINDOW_FIELDS = (
    "id",
    "tenant_id",
    "project_id",
    "priority",
    "state",
    "duration_hours",
    "reserved_start",
    "cpu_cores",
    "memory_gb",
    "quota_exception",
    "quota_reasons",
    "approved_spec",
    "approved_spec_hash",
    "serving_replicas",
    "created_at",
    "queue_position",
    "queue_reason",
    "queue_estimate",
)


def _queue_window(window: int) -> list[ResourceRequest]:
    """The cycle's share of the queue, locked, in queue order: with a window, the first `window` requests in queue
    order (one narrow read of the whole queue's order keys, then the rows of the window only); without, all.

    Fairness rule: the queue order decides who is in the window, so the head of every priority class is always
    seen and a request waits outside it only while at least `window` requests are ahead of it; those behind keep
    the position and reason a cycle last gave them (new ones have none yet) until the window reaches them."""
    queued = ResourceRequest.objects.filter(state=RequestState.QUEUED)
    if window:
        keys = [_Queued(*row) for row in queued.values_list("pk", "priority", "project_id", "created_at")]
        if len(keys) > window:
            head = [key.pk for key in queue_order(keys)[:window]]
            queued = queued.filter(pk__in=head)
    # Rows another transaction holds are waited for, not skipped: a skipped request would wait for the next
    # trigger (its holder, e.g. a cancellation, may well commit without sending one).
    return queue_order(list(queued.select_for_update().order_by("pk").only(*WINDOW_FIELDS)))


def _card_hours_this_month(project_ids: set[int]) -> dict[int, object]:
    return dict(
        MonthlyUsage.objects.filter(project_id__in=project_ids, month=month_start()).values_list(
            "project_id", "card_hours"
        )
    )


def _over_concurrency(queue: list[ResourceRequest]) -> dict[int, dict]:
    """Requests whose project already holds as many allocations as its concurrent-task limit allows."""
    holding = dict(
        ResourceRequest.objects.filter(
            project_id__in={request.project_id for request in queue}, state__in=HOLDING_STATES
        )
        .values("project_id")
        .annotate(n=Count("id"))
        .values_list("project_id", "n")
    )
    limits = dict(
        ProjectQuota.objects.filter(project_id__in={request.project_id for request in queue}).values_list(
            "project_id", "concurrent_tasks"
        )
    )
    refused = {}
    for request in queue:
        limit, held = limits.get(request.project_id), holding.get(request.project_id, 0)
        if limit is not None and held >= limit and not _excepted_from_concurrency(request):
            refused[request.pk] = {
                "code": QUOTA_EXHAUSTED,
                "numbers": {"holding": held, "limit": limit},
                "message": f"The project already holds {held} of its {limit} concurrent tasks; waits for one to end.",
            }
        elif limit is not None:
            holding[request.project_id] = held + 1  # admitted requests of this cycle count too
    return refused


def _gangs_without_backend(queue: list[ResourceRequest]) -> dict[int, dict]:
    """The multi-node gangs of the queue, each with its reason, while no backend here runs multi-node work: they
    wait rather than be placed on nodes where they would fail (scheduling.backends.MULTI_NODE_BACKENDS)."""
    gangs = {request.pk: (request.approved_spec.get("spec") or {}).get("nodes", 1) for request in queue}
    gangs = {pk: nodes for pk, nodes in gangs.items() if nodes > 1}
    if not gangs or backends.runs_multi_node():
        return {}
    return {pk: backends.multi_node_reason(nodes=nodes) for pk, nodes in gangs.items()}


def _excepted_from_concurrency(request: ResourceRequest) -> bool:
    """Admitted over the concurrent-task limit through an approved quota exception: the approvers agreed to this
    request running beyond the limit, so the scheduler must not hold it back for that limit again."""
    return request.quota_exception and any(
        reason.get("dimension") == QuotaDimension.CONCURRENT_TASKS for reason in request.quota_reasons
    )


def _continued_terms(bindings, requests: dict[int, ResourceRequest]) -> dict[int, datetime]:
    """A serving endpoint woken from zero continues the term its first allocation began: scaling to zero and back
    never stretches the approved duration (one read, only when such an endpoint is placed)."""
    woken = {int(binding.demand_id) for binding in bindings if requests[int(binding.demand_id)].serving_replicas}
    if not woken:
        return {}
    return dict(
        Allocation.objects.filter(request_id__in=woken)
        .values("request_id")
        .annotate(started=Min("term_started_at"))
        .values_list("request_id", "started")
        .order_by()
    )


def _binding_rows(bindings, cluster: ClusterSnapshot, requests: dict[int, ResourceRequest], now):
    allocations, devices = [], []
    terms = _continued_terms(bindings, requests)
    for binding in bindings:
        request = requests[int(binding.demand_id)]
        allocations.append(
            Allocation(
                request=request,
                node_id=cluster.node_ids[binding.node],
                cpu_milli=binding.cpu_milli,
                memory_mib=binding.memory_mib,
                priority=PRIORITY_RANK[request.priority],
                # A reservation is never preempted: its window was promised.
                preemptible=request.priority == PriorityClass.BATCH and request.reserved_start is None,
                term_started_at=terms.get(request.pk, now),
                replica=binding.replica,
                member=binding.member,
            )
        )
        devices.append([(cluster.device_ids[(binding.node, position)], milli) for position, milli in binding.devices])
    return allocations, devices


def _bind_devices(device_shares: list[tuple[int, int]]) -> None:
    totals: dict[int, int] = {}
    for device_id, milli in device_shares:
        totals[device_id] = totals.get(device_id, 0) + milli
    adjust_device_shares(totals)


def _commit_bindings(
    result, cluster: ClusterSnapshot, requests: dict[int, ResourceRequest], now, engine: mig_cycle.CycleEngine
) -> list[int]:
    allocations, device_lists = _binding_rows(result.bindings, cluster, requests, now)
    Allocation.objects.bulk_create(allocations)
    plans = engine.committed_plans(result.bindings)
    rows = [
        AllocationDevice(
            allocation=allocation,
            device_id=device_id,
            milli=milli,
            mig_changes=mig_cycle.card_changes(plans.get((binding.demand_id, binding.node, position))),
        )
        for binding, allocation, shares in zip(result.bindings, allocations, device_lists, strict=True)
        for (position, _milli), (device_id, milli) in zip(binding.devices, shares, strict=True)
    ]
    AllocationDevice.objects.bulk_create(rows)
    _bind_devices([(row.device_id, row.milli) for row in rows])
    mig_cycle.record_instances(engine, plans, result.bindings, cluster)
    instances = engine.instances
    placed, replicated, gangs = [], {}, {}
    for binding, shares in zip(result.bindings, device_lists, strict=True):
        if binding.replica is not None:  # one event for all of a deployment's replicas, below
            replicated.setdefault(binding.demand_id, []).append((binding, shares))
            continue
        if binding.member is not None:  # one event for all of a gang's members, below
            gangs.setdefault(binding.demand_id, []).append((binding, shares))
            continue
        message, data = (
            f"Allocated on {binding.node}: {counted(len(shares), 'device')}.",
            {"node": binding.node, "devices": shares},
        )
        held = [mig_cycle.describe(instance, binding.node) for instance in instances.get(binding.demand_id, ())]
        if held:  # the GPU instances the request holds, in words and numbers
            message = f"Allocated on {binding.node}: " + " ".join(words for words, _numbers in held)
            data = {**data, "mig_instance": held[0][1], "mig_instances": [numbers for _words, numbers in held]}
        placed.append((requests[int(binding.demand_id)], message, data))
    placed += [(requests[int(demand_id)], *_replicas_allocated(bound)) for demand_id, bound in replicated.items()]
    placed += [
        (request, *_gang_allocated(bound, cluster.snapshot.nodes, _topology_level(request)))
        for request, bound in ((requests[int(demand_id)], bound) for demand_id, bound in gangs.items())
    ]
    requests_allocate(placed=placed)
    return [request.pk for request, _, _ in placed]


def _replicas_allocated(bound: list[tuple[Binding, list]]) -> tuple[str, dict]:
    """The ALLOCATED event of a replicated request: each replica with its node and devices, and a note when
    replicas had to share a node."""
    spread = spread_note([binding for binding, _shares in bound])
    where = ", ".join(f"replica {binding.replica} on {binding.node}" for binding, _shares in bound)
    return (
        f"Allocated {len(bound)} replicas: {where}." + (f" {spread['message']}" if spread else ""),
        {
            "node": bound[0][0].node,
            "devices": [share for _binding, shares in bound for share in shares],
            "replicas": [
                {"replica": binding.replica, "node": binding.node, "devices": shares} for binding, shares in bound
            ],
            "spread": spread,
        },
    )


def _topology_level(request: ResourceRequest) -> str:
    return (request.approved_spec["spec"].get("topology") or {}).get("level", "rack")


def _gang_allocated(bound: list[tuple[Binding, list]], nodes, level: str) -> tuple[str, dict]:
    """The ALLOCATED event of a multi-node gang: each member with its node and devices, and the domains the gang
    took (gang_split: in one domain of its level, or split)."""
    bound = sorted(bound, key=lambda pair: pair[0].member)
    where = ", ".join(f"member {binding.member} on {binding.node}" for binding, _shares in bound)
    split = gang_split([binding for binding, _shares in bound], nodes, level)
    return (
        f"Allocated {len(bound)} nodes as one gang: {where}; {split['message']}.",
        {
            "split": split,
            "node": bound[0][0].node,
            "devices": [share for _binding, shares in bound for share in shares],
            "members": [
                {"member": binding.member, "node": binding.node, "devices": shares} for binding, shares in bound
            ],
        },
    )


def _reserve_for_the_head(
    cluster: ClusterSnapshot, engine: mig_cycle.CycleEngine, result, demands, requests, now
) -> backfill.Reservation | None:
    hours = {demand.id: requests[int(demand.id)].duration_hours for demand in demands}
    reservation = backfill.reserve_for_head(
        engine=engine,
        allocations=cluster.snapshot.allocations,
        expires=cluster.expires,
        result=result,
        demands=demands,
        hours=hours,
        now=now,
    )
    if reservation is not None:
        backfill.hold_back_delaying(result, reservation, demands, hours, now)
    return reservation


def _gang_waits_timed(result, demands: list[Demand], engine, cluster: ClusterSnapshot, requests, now) -> list:
    """The cycle's waits, a gang's `topology_constraint` with when its best domain gets the nodes it lacks: running
    work ends as approved, and what this cycle placed after its approved duration."""
    gangs = {demand.id: demand for demand in demands if demand.nodes > 1}
    if not any(pending.demand_id in gangs for pending in result.pending):
        return result.pending
    placed = forecasting.placed_allocations(result.bindings, now)
    ends = {
        **cluster.expires,
        **{run.id: now + timedelta(hours=requests[int(run.id)].duration_hours) for run in placed},
    }
    running = [*cluster.snapshot.allocations, *placed]
    return [
        with_domain_frees(engine, pending, gangs[pending.demand_id], running, ends, now)
        if pending.demand_id in gangs
        else pending
        for pending in result.pending
    ]


def _aged_rank_of(request: ResourceRequest, now: datetime) -> int:
    return aged_rank(request.priority, request.created_at, now)


def _closed(snapshot: Snapshot, unavailable: dict) -> Snapshot:
    """The snapshot with the nodes of unavailable backends closed to new work, as the order preview must see it."""
    if not unavailable:
        return snapshot
    nodes = [replace(node, schedulable=False) if node.name in unavailable else node for node in snapshot.nodes]
    return Snapshot(nodes, snapshot.allocations)


def _place_around_windows(engine, cluster: ClusterSnapshot, demands, hours, not_due, reserved: set[str], now):
    """Place the queue around the windows held ahead (scheduling/reservations.py): the nodes planned for
    reservations not begun and those of maintenance windows, closed to it, then backfilled with the work that ends
    before each window starts (`reserved`: the due reservations' demand ids, which may take reservations' nodes).
    Returns the placement, the reservations' plans, every window held (for the forecast) and the cycle's nodes as its
    outcome keeps them (held nodes open again, nodes in maintenance now closed)."""
    # Windows that start before every queued demand would end are the ones that can keep work off a node.
    reach = now + timedelta(hours=max(hours.values(), default=0))
    maintenance = _maintenance_ahead(now)
    plans = reservations.plan_nodes(
        start_engine=engine.start,
        running=cluster.snapshot.allocations,
        expires=cluster.expires,
        not_due_requests=not_due,
        closed=list(engine.closed),
        maintenance=maintenance,
        demand_of=demand_of,
        failures=selectors.node_failures,
        domains=selectors.domains_of,
        horizon=now + timedelta(days=settings.RESERVATION_HORIZON_DAYS),
    )
    holding = [plan for plan in [*plans, *maintenance] if plan.start < reach]
    held = {node for plan in holding for node in plan.nodes} - set(engine.closed)
    for name in held:
        engine.close_node(name)  # held for a window: only work over before it starts goes there
    result = engine.place(demands)
    reservations.backfill_planned(
        engine=engine,
        result=result,
        plans=holding,
        demands=demands,
        hours=hours,
        reservation_ids=reserved,
        now=now,
    )
    in_maintenance = {node for plan in maintenance if plan.start <= now for node in plan.nodes}
    windows = [plan.held_window for plan in [*plans, *maintenance] if plan.nodes]
    return result, plans, windows, _reopened(engine.milli.nodes, held - in_maintenance)


def _maintenance_ahead(now: datetime) -> list[reservations.Plan]:
    return reservations.maintenance_plans(now=now, until=now + timedelta(days=settings.RESERVATION_HORIZON_DAYS))


def _reopened(nodes: list[NodeView], held: set[str]) -> list[NodeView]:
    """The nodes as the cycle's outcome keeps them: those closed only because a window ahead holds them open again
    (the preview and the earliest-window search judge time themselves)."""
    if not held:
        return nodes
    return [replace(node, schedulable=True) if node.name in held else node for node in nodes]


def _waiting_for_backends(pending, demands, nodes, unavailable: dict) -> dict[int, dict]:
    """Waiting requests that a node of an unavailable backend could take: they wait for that backend (its
    sentence, e.g. "Slurm controller unreachable since 14:02 UTC: new orders wait."), not for capacity. Requests that
    could never fit keep saying so."""
    if not unavailable:
        return {}
    models = {}  # model slug -> the status of an unavailable backend with such cards
    for node in nodes:
        for device in node.devices if node.name in unavailable else ():
            models.setdefault(device.model, unavailable[node.name])
    by_id = {demand.id: demand for demand in demands}
    blamed = {}
    for waiting in pending:
        wanted = by_id[waiting.demand_id].models or models.keys()
        status = next((models[model] for model in wanted if model in models), None)
        if status is not None and waiting.reason != NO_MATCHING_SPEC:
            blamed[int(waiting.demand_id)] = backends.waiting_reason(status)
    return blamed


def run_cycle(*, policy: str = "default") -> CycleResult:
    """Place what the queue holds; record every other request's position and reason. Cycles that ran report their
    duration (cycle_finished).

    When another cycle is running, leave it a wake-up and return `ran=False`; when wake-ups arrived while this
    cycle ran, run again. Called outside a transaction (as the tasks do), so the lock is free once a cycle returns.
    """
    result = _timed_cycle(policy)
    if not result.ran:
        _leave_wakeup()
        # The running cycle may have committed and looked for wake-ups before ours landed: then it is ours to run.
        result = _timed_cycle(policy)
    while result.ran and _wakeups() != result.wakeups:
        again = _timed_cycle(policy)
        if not again.ran:  # a newer cycle took the lock after our commit; it sees the same wake-ups at its end
            break
        result = result.followed_by(again)
    return result


def _timed_cycle(policy: str) -> CycleResult:
    started = time.perf_counter()
    with _collector_paused():
        result = _cycle(policy)
    if result.ran:
        cycle_finished.send(
            sender=CycleResult,
            seconds=time.perf_counter() - started,
            allocated=len(result.allocated),
            waiting=len(result.waiting),
        )
    return result


@contextmanager
def _collector_paused():
    """The cyclic garbage collector paused while a cycle runs, and one pass over what the cycle allocated after it.

    A cycle allocates millions of small objects, many kept with the engine between cycles (shape heaps, score memos),
    and each full pass of the collector walks all the kept ones again: on a large fleet it made several full passes a
    cycle, a large share of the cycle's CPU. Reference cycles a cycle leaves (rows, querysets) wait for its end."""
    if not gc.isenabled():  # paused already by the caller: left to it
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def _cycle(policy: str) -> CycleResult:
    with transaction.atomic():
        if not _take_cycle_lock():
            return CycleResult(ran=False)
        wakeups = _wakeups()  # before the queue read: a wake-up left after it means one more cycle
        now = timezone.now()
        carried = preemption.carry_out(now)  # due preemptions first: this cycle places their winners
        queue = _queue_window(settings.SCHEDULER_CYCLE_WINDOW)
        unavailable = backends.unavailable_nodes()
        if not queue:
            cluster = _kept_snapshot()
            snapshot = _closed(cluster.snapshot, unavailable)
            inputs = forecasting.cycle_inputs(
                allocations=snapshot.allocations,
                expires=cluster.expires,
                bindings=[],
                demands=[],
                hours={},
                ranks={},
                reasons={},
                now=now,
                windows=[plan.held_window for plan in _maintenance_ahead(now) if plan.nodes],  # for the preview
            )
            record_outcome(
                snapshot=snapshot,
                bindings=[],
                reservation=None,
                waiting=[],
                forecast=forecasting.stored(inputs),
                now=now,
            )
            return CycleResult(ran=True, preempted=carried.preempted, wakeups=wakeups)
        due = reservations.not_due(queue, now)  # before its window a reservation only waits (and counts nothing)
        refused = {**due, **_gangs_without_backend(queue), **_over_concurrency([r for r in queue if r.pk not in due])}
        by_id = {request.pk: request for request in queue}
        candidates = [request for request in queue if request.pk not in refused]
        cluster = _kept_snapshot()
        demands = [demand_of(request) for request in candidates]
        # One queue order for every demand: slices of MIG-capable models go to the geometry-true engine, the rest
        # to the milli-share engine, each seeing what the other bound (scheduling/mig/cycle.py).
        engine = mig_cycle.cycle_engine(
            cluster,
            demands,
            policy,
            lambda snapshot: kept_engine.kept.engine_for(snapshot, policy, demands, source=cluster.source),
        )
        for name in unavailable.keys() & cluster.node_ids.keys():
            engine.close_node(name)  # the backend does not answer: what would go there waits for it
        unanswered = list(engine.closed)  # the forecast closes these; the windows' nodes only while they are held
        hours = {demand.id: by_id[int(demand.id)].duration_hours for demand in demands}
        reserved = {str(request.pk) for request in candidates if request.reserved_start is not None}
        result, plans, windows, reopened = _place_around_windows(
            engine, cluster, demands, hours, [by_id[pk] for pk in due], reserved, now
        )
        previous = {pk: by_id[pk].queue_reason for pk in due}
        reservations.note_plans(due, plans, previous)
        requests_note_replans(notes=[(by_id[pk], *note) for pk, *note in reservations.replan_notes(plans, previous)])
        cluster = replace(cluster, snapshot=Snapshot(reopened, cluster.snapshot.allocations))
        reservation = _reserve_for_the_head(cluster, engine, result, demands, by_id, now)
        allocated = _commit_bindings(result, cluster, by_id, now, engine)
        in_words = namer()
        reasons = {
            **refused,
            **{
                int(pending.demand_id): {
                    "code": pending.reason,
                    "message": in_words(pending.message),
                    "numbers": dict(pending.numbers),
                }
                for pending in _gang_waits_timed(result, demands, engine.milli, cluster, by_id, now)
            },
        }
        reasons.update(_waiting_for_backends(result.pending, demands, cluster.snapshot.nodes, unavailable))
        reasons.update(
            preemption.schedule(
                cluster=cluster,
                result=result,
                demands=demands,
                requests=by_id,
                scheduled=carried.scheduled,
                waiting=reasons,
                now=now,
                engine=engine,
            )
        )
        waiting = [request for request in queue if request.pk in reasons]
        inputs = forecasting.cycle_inputs(
            allocations=cluster.snapshot.allocations,
            expires=cluster.expires,
            bindings=result.bindings,
            demands=demands,
            hours=hours,
            ranks={demand.id: _aged_rank_of(by_id[int(demand.id)], now) for demand in demands},
            reasons=reasons,
            now=now,
            windows=windows,
        )
        placed = forecasting.placed_allocations(result.bindings, now)
        estimates = forecasting.queue_estimates(
            engine_now=lambda: engine.at_start(placed, closed=unanswered), inputs=inputs, reasons=reasons, now=now
        ) | reservations.not_due_estimates(due)
        record_outcome(
            snapshot=cluster.snapshot,
            bindings=result.bindings,
            reservation=reservation,
            waiting=waiting,
            forecast=forecasting.stored(inputs),
            now=now,
        )
        requests_note_queue(
            waiting=[(request, position, reasons[request.pk]) for position, request in enumerate(waiting, start=1)],
            estimates=estimates,
        )
        transaction.on_commit(lambda: requests_allocated.send(sender=Allocation, request_ids=allocated))
    return CycleResult(
        ran=True,
        allocated=allocated,
        waiting={pk: reason["code"] for pk, reason in reasons.items()},
        preempted=carried.preempted,
        wakeups=wakeups,
    )
