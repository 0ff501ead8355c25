"""The order preview's "would it fit now?" (against what the last cycle left, the requests queued since placed
first, then the order) and the submission's "could it ever fit?" (against the inventory alone).

A slice of MIG-capable models is previewed geometry-true: the last cycle's outcome keeps milli-shares per card, not
GPU-instance layouts, so its preview places on the cycle's own engines (scheduling.mig.cycle) over the inventory,
what runs on it and the MIG layouts now, the queued requests ahead in queue order first: the answer the next cycle
would give, its reasons in MIG terms (free memory slices, valid starts). That costs the cycle's snapshot queries
and the queue ahead; only MIG orders pay it."""

import functools
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from catalog.models import SliceProfile
from config.words import counted
from requests import start_words
from requests.choices import PRIORITY_RANK, RequestState
from requests.models import ResourceRequest
from scheduling import backends, cluster_state
from scheduling.cycle import demand_of, load_inventory, load_snapshot, make_demand, queue_order, serving_of
from scheduling.engine import (
    HIGHER_PRIORITY_AHEAD,
    NO_MATCHING_SPEC,
    Demand,
    NodeView,
    Pending,
    PlacementEngine,
    spread_note,
    unplaceable,
    with_domain_frees,
)
from scheduling.engine.forecast import TIMED_REASONS
from scheduling.expected_start import decoded_inputs, order_expected_start
from scheduling.forecasting import from_stored
from scheduling.mig import cycle as mig_cycle
from scheduling.models import Device, Node
from scheduling.outcome import last_outcome
from scheduling.reason_words import named

PREVIEW_ID = "preview"
# Requests queued since the last cycle that a preview places ahead of the order. A cycle runs on every queued
# request (and each minute), so more than this means one is due; the preview must not grow with the backlog.
MAX_QUEUED_SINCE = 200


@dataclass(frozen=True)
class Queued:
    """A queued request as demand_of and queue_order read it: a preview places up to MAX_QUEUED_SINCE of them, and
    building model instances (each with its state machine's bookkeeping) cost more than placing them."""

    pk: int
    priority: str
    project_id: int
    created_at: datetime
    approved_spec: dict
    cpu_cores: int
    memory_gb: int
    serving_replicas: int | None


QUEUED_FIELDS = [field.name for field in fields(Queued)]


def order_demand(order, sizing, models: list) -> Demand:
    """The engine's view of an order that is not stored yet (the same shape a queued request would have); `models`:
    its accelerator models (order_models)."""
    sizes = {"cpu_cores": sizing.cpu_cores, "memory_gb": sizing.memory_gb}
    if order.bare_metal_profile is not None:
        profile = order.bare_metal_profile
        return make_demand(
            PREVIEW_ID,
            order.priority,
            count=profile.accelerator_count,
            models=frozenset(model.slug for model in models),
            **sizes,
        )
    spec, model, template = order.spec, order.serving_model, order.serving_template
    return make_demand(
        PREVIEW_ID,
        order.priority,
        count=sizing.accelerator_count,
        slice_profile=spec.slice_profile.name if spec.slice_profile else None,
        models=frozenset(model.slug for model in models),
        replicas=order.replicas,
        serving=None if template is None else serving_of(template.runtime, model.artifact_uri, str(model)),
        nodes=spec.node_count,
        topology={"level": spec.topology_level, "mode": spec.topology_mode},
        **sizes,
    )


def order_models(order) -> list:
    """The accelerator models an order names (read with its catalog items): what its reasons may mention."""
    if order.bare_metal_profile is not None:
        return [order.bare_metal_profile.accelerator_model]
    return list(order.spec.accelerator_models.all())


def placement_estimate(order, sizing) -> dict:
    """Whether the order fits now behind the queue ahead of it, or why not; `never_fits` when no node of the
    inventory could hold it even empty (then the queue is not even looked at).

    Estimated against what the last cycle left (its free capacity, head-of-line reservation and the requests it
    left waiting) plus the requests queued since, so a preview costs the same few queries and the same time at any
    queue length; `as_of` and `age_seconds` say how old that picture is (a request cancelled since still counts in
    `queued_ahead` until the next cycle). Before any cycle has run, the whole queue is placed as the cycle would.
    While a backend whose nodes could take the order does not answer, the order would wait for it, and says so."""
    models = order_models(order)  # read once: the demand's and the sentence's
    demand = order_demand(order, sizing, models)
    runs_gangs = demand.nodes > 1 and backends.runs_multi_node()  # a query for a gang's preview only
    demand = _judged_anywhere(demand, runs_gangs=runs_gangs)
    outcome = last_outcome()
    estimate = _waiting_for_multi_node(
        demand, _waiting_for_backend(demand, _estimate_of(demand, order, outcome)), runs_gangs=runs_gangs
    )
    return _in_words(_with_expected_start(estimate, demand, order.duration_hours, outcome), models)


def _judged_anywhere(demand: Demand, *, runs_gangs: bool) -> Demand:
    """While no node here has a backend that runs multi-node work, a gang is judged on every node (it would wait
    for the backend anyway, and its topology numbers say what it would need); else only on such nodes, as the cycle
    places it."""
    if runs_gangs or demand.nodes == 1:
        return demand
    return replace(demand, needs=demand.needs - {backends.MULTI_NODE_CAPABILITY})


def _waiting_for_multi_node(demand: Demand, estimate: dict, *, runs_gangs: bool) -> dict:
    """A multi-node gang that would fit now waits while no backend here runs multi-node work, as the cycle keeps it
    waiting (`backends.multi_node_reason`); one that would wait anyway keeps its own reason (its topology numbers)."""
    if demand.nodes == 1 or not estimate["fits_now"] or runs_gangs:
        return estimate
    reason = backends.multi_node_reason(nodes=demand.nodes)
    kept = {key: estimate[key] for key in ("queued_ahead", "as_of", "age_seconds")}
    return {
        "fits_now": False,
        "never_fits": False,
        **kept,
        "code": reason["code"],
        "message": f"Would wait: {reason['message']}.",
        "details": reason["numbers"],
    }


def _with_expected_start(estimate: dict, demand: Demand, hours, outcome) -> dict:
    """An order that would wait for capacity gets its expected start "if submitted now", replayed from the last
    cycle's picture (scheduling.expected_start: no query of its own)."""
    if estimate["fits_now"] or estimate["code"] not in TIMED_REASONS:
        return estimate
    data = order_expected_start(demand, float(hours), outcome)
    return {**estimate, "expected_start": start_words.expected_start(data)}


def _in_words(estimate: dict, models) -> dict:
    """The estimate with its sentence naming the order's models as the catalog does."""
    return {**estimate, "message": named(estimate["message"], models)}


def _estimate_of(demand, order, outcome) -> dict:
    if mig_cycle.placed_geometry_true(demand):
        return _mig_estimate(demand, _delaying(order, outcome))
    if outcome is None:
        snapshot = load_snapshot().snapshot
        ahead = [] if unplaceable(snapshot.nodes, demand) else _queued(demand)  # never fits: no queue
        return _estimate(demand, lambda: PlacementEngine(snapshot, workload=[demand]), ahead, len(ahead))
    since, since_count = _queued_since_last_cycle(demand)
    left_waiting = sum(outcome.waiting.get(name, 0) for name in _classes_from(demand))
    return _estimate(
        demand,
        lambda: outcome.engine_for(demand),
        since,
        left_waiting + since_count,
        as_of=outcome.finished_at,
        held=_delaying(order, outcome),
        timed=_gang_wait_timed(demand, outcome),
        windows=_held_in_term(outcome, order.duration_hours),
    )


def _held_in_term(outcome, hours) -> list:
    """The windows held ahead (the last cycle's: reservations' planned nodes, maintenance) that an order starting now
    would run into."""
    now = timezone.now()
    ends = now + timedelta(hours=float(hours))
    return [window for window in decoded_inputs(outcome).windows if window.start < ends and window.end > now]


def _gang_wait_timed(demand: Demand, outcome):
    """For a gang: its wait on topology with when its best domain frees the nodes it lacks, from the running work's
    approved ends the last cycle stored (as the cycle says it); None for other orders."""
    if demand.nodes == 1:
        return None
    inputs = from_stored(outcome.forecast)
    running = [allocation for work in inputs.running for allocation in work.allocations]
    ends = {work.allocations[0].id: work.ends for work in inputs.running}
    return lambda engine, pending: with_domain_frees(engine, pending, demand, running, ends, timezone.now())


def _waiting_for_backend(demand: Demand, estimate: dict) -> dict:
    """The estimate, unless a backend that does not answer holds nodes the order would take (the one it would fit
    on, or, when it would wait anyway, any with its cards): then it waits for that backend (one query while every
    backend answers; three when one does not)."""
    statuses = backends.unavailable_backends()
    if estimate["never_fits"] or not statuses:
        return estimate
    unavailable = backends.unavailable_nodes(statuses)
    if estimate["fits_now"]:
        blocked = [unavailable[name] for name in estimate.get("nodes", [estimate["node"]]) if name in unavailable]
    else:
        holding = Device.objects.filter(node__name__in=unavailable)
        if demand.models:
            holding = holding.filter(model__slug__in=demand.models)
        blocked = [unavailable[name] for name in holding.values_list("node__name", flat=True)[:1]]
    if not blocked:
        return estimate
    reason = backends.waiting_reason(blocked[0])
    kept = {key: estimate[key] for key in ("queued_ahead", "as_of", "age_seconds")}
    return {
        "fits_now": False,
        "never_fits": False,
        **kept,
        "code": reason["code"],
        "message": reason["message"],
        "details": reason["numbers"],
    }


def _delaying(order, outcome) -> dict | None:
    """The last cycle's head-of-line reservation when the order would still run at its start, else None."""
    reservation = None if outcome is None else outcome.reservation
    if reservation is None:
        return None
    ends = timezone.now() + timedelta(hours=order.duration_hours)
    return reservation if ends > datetime.fromisoformat(reservation["start"]) else None


def _mig_estimate(demand: Demand, held: dict | None) -> dict:
    """A MIG slice placed as the cycle would place it now (module docstring)."""
    cluster = load_snapshot()
    ahead = _queued(demand)
    demands = [*map(demand_of, ahead), demand]
    return _estimate(demand, lambda: mig_cycle.cycle_engine(cluster, demands), ahead, len(ahead), held=held)


def _classes_from(demand: Demand) -> list[str]:
    """The priority classes that queue ahead of the demand (its own and higher)."""
    return [name for name, rank in PRIORITY_RANK.items() if rank >= demand.priority]


def _queued_ahead_of(demand: Demand):
    """The queued requests ahead of the demand."""
    return ResourceRequest.objects.filter(state=RequestState.QUEUED, priority__in=_classes_from(demand))


def _as_queued(rows) -> list[Queued]:
    return [Queued(*row) for row in rows.values_list(*QUEUED_FIELDS)]


def _queued(demand: Demand) -> list[Queued]:
    """The queued requests ahead of the demand in queue order."""
    return queue_order(_as_queued(_queued_ahead_of(demand)))


def _queued_since_last_cycle(demand: Demand) -> tuple[list[Queued], int]:
    """The queued requests ahead of the demand that no cycle has seen yet (a cycle gives every request it leaves
    waiting a position): the first MAX_QUEUED_SINCE of them in queue order, and how many there are. An index holds
    just these, so the queue behind them costs nothing."""
    unseen = _queued_ahead_of(demand).filter(queue_position__isnull=True)
    keys = list(unseen.order_by("created_at", "pk").values_list("pk", "priority", "created_at")[:MAX_QUEUED_SINCE])
    first = _unseen_rows.rows(keys)
    return queue_order(first), len(first) if len(first) < MAX_QUEUED_SINCE else unseen.count()


class UnseenRows:
    """The rows of the requests queued since the last cycle, read once per process rather than on every preview:
    while a backlog builds up between cycles every preview places the same first MAX_QUEUED_SINCE, and reading their
    frozen snapshots (JSON) was most of a preview's time. A request's row does not change while it waits (what it
    needs is frozen when it is approved), except its priority, which comes with its id from the index every time: a
    row kept under another priority is read again, and so is one of another submission time (an id used again, as
    after a database is flushed)."""

    LIMIT = 10 * MAX_QUEUED_SINCE  # then the kept rows start over

    def __init__(self):
        self.kept: dict[int, Queued] = {}

    def rows(self, keys: list[tuple[int, str, datetime]]) -> list[Queued]:
        # One dict for the whole call: a threaded server's other call may start the kept rows over meanwhile.
        kept = self.kept
        missing = [key[0] for key in keys if self._key(kept.get(key[0])) != key]
        if len(kept) + len(missing) > self.LIMIT:
            kept = self.kept = {}
            missing = [key[0] for key in keys]
        if missing:
            for pk in missing:  # kept under another priority or time: read again, or left out if gone
                kept.pop(pk, None)
            kept.update((row.pk, row) for row in _as_queued(ResourceRequest.objects.filter(pk__in=missing)))
        # One gone since its id was read (cancelled, placed) is left out, as it would have been a moment later.
        return [row for row in map(kept.get, (key[0] for key in keys)) if row is not None]

    @staticmethod
    def _key(row: Queued | None) -> tuple | None:
        return None if row is None else (row.pk, row.priority, row.created_at)


_unseen_rows = UnseenRows()


def _estimate(
    demand, fresh_engine, ahead: list[Queued], ahead_count: int, as_of=None, held=None, timed=None, windows=()
) -> dict:
    """`fresh_engine()` gives an engine to place on, at the state the estimate starts from; `timed(engine,
    pending)` adds to why it waits when what it lacks frees (a gang's); `windows` the windows held that it would run
    into if it started now."""
    freshness = {
        "as_of": None if as_of is None else as_of.isoformat(),
        "age_seconds": None if as_of is None else _age_seconds(as_of),
    }
    outcome = _place_behind(demand, fresh_engine, ahead, held, timed)
    if windows and not isinstance(outcome, Pending):
        outcome = _off_windows(demand, fresh_engine, ahead, outcome, windows)
    if isinstance(outcome, Pending) and outcome.reason == NO_MATCHING_SPEC:
        return {
            "fits_now": False,
            "never_fits": True,
            "queued_ahead": None,
            "code": outcome.reason,
            "message": _sentence(outcome.message),
            "details": dict(outcome.numbers),
            **freshness,
        }
    if isinstance(outcome, Pending):
        return {
            "fits_now": False,
            "never_fits": False,
            "queued_ahead": ahead_count,
            "code": outcome.reason,
            "message": f"{_waiting_behind(ahead_count)}: {outcome.message}.",
            "details": dict(outcome.numbers),
            **freshness,
        }
    node = outcome[0].node
    nodes = list(dict.fromkeys(binding.node for binding in outcome))  # a serving order's replicas: each one's node
    spread = spread_note(outcome) if demand.replicas > 1 else None
    return {
        "fits_now": True,
        "never_fits": False,
        "queued_ahead": ahead_count,
        "node": node,
        **({"nodes": [binding.node for binding in outcome], "spread": spread} if demand.replicas > 1 else {}),
        "code": None,
        "message": f"Fits now on {', '.join(nodes)}"
        + (f", after the {counted(ahead_count, 'request')} ahead." if ahead_count else ".")
        + (f" {spread['message']}" if spread else ""),
        **freshness,
    }


def _waiting_behind(ahead_count: int) -> str:
    return f"Would queue behind {counted(ahead_count, 'request')}" if ahead_count else "Would wait"


def _place_behind(demand, fresh_engine, ahead: list[Queued], held: dict | None, timed=None):
    """The order's binding (or why not) once the requests ahead are placed; `held` is the head's reservation when
    the order would still run at its start: then the order stays off that node, as the cycle would keep it off."""
    engine = fresh_engine()
    outcome = _place_after(engine, demand, ahead)
    if timed is not None and isinstance(outcome, Pending):
        return timed(engine, outcome)
    held_nodes = set(held.get("nodes") or [held["node"]]) if held else set()  # a gang's: all its members' nodes
    if held is None or isinstance(outcome, Pending) or not held_nodes & {binding.node for binding in outcome}:
        return outcome
    off_the_held_nodes = fresh_engine()
    for node in held_nodes:
        off_the_held_nodes.close_node(node)
    elsewhere = _place_after(off_the_held_nodes, demand, ahead)
    if not isinstance(elsewhere, Pending):
        return elsewhere
    node = next(binding.node for binding in outcome if binding.node in held_nodes)
    return Pending(
        demand.id,
        HIGHER_PRIORITY_AHEAD,
        f"it would fit on {node} now but still be running when request #{held['request_id']} is due to "
        f"start there ({datetime.fromisoformat(held['start']):%Y-%m-%d %H:%M} UTC); it waits so that larger "
        "request is not starved",
        {"reserved_for": held["request_id"], "node": node, "reserved_from": held["start"]},
    )


def _off_windows(demand, fresh_engine, ahead: list[Queued], placed, windows):
    """A placement on a node a window holds while the order would run moves off it, as the cycle keeps it off; with
    no room elsewhere the order waits, naming the window (a wait the forecast times)."""
    on = {node: window for window in windows for node in window.nodes}
    node = next((binding.node for binding in placed if binding.node in on), None)
    if node is None:
        return placed
    engine = fresh_engine()
    for name in on.keys() & engine.node_index.keys():
        engine.close_node(name)
    elsewhere = _place_after(engine, demand, ahead)
    if not isinstance(elsewhere, Pending):
        return elsewhere
    window = on[node]
    return Pending(
        demand.id,
        window.code,
        f"{window.sentence(node)}; it would still run then, so it waits for a node that is free for its whole term",
        {"node": node, "reserved_from": window.start.isoformat(), "until": window.end.isoformat()},
    )


def _place_after(engine, demand, ahead: list[Queued]):
    """The demand's binding (or why not) once the requests ahead took what fits them on the engine (the milli-share
    engine, or the cycle's pair of engines for a MIG slice). Only their bindings matter here, so a shape that did
    not fit is not tried again and nothing is diagnosed (the cycle will say why they wait)."""
    failed = set()
    # Gangs wait as the cycle keeps them waiting (`_gangs_without_backend`); asked once, and only with a gang ahead.
    gangs_wait = functools.cache(lambda: not backends.runs_multi_node())
    for request in ahead:
        queued = demand_of(request)
        if queued.nodes > 1 and gangs_wait():
            continue
        shape = (
            queued.count,
            queued.slice_profile,
            queued.models,
            queued.cpu_milli,
            queued.memory_mib,
            queued.replicas,
            queued.nodes,
            queued.level,
            queued.mode,
        )
        if shape in failed:
            continue
        if engine.fits(queued):
            engine.place_one(queued)
        else:
            failed.add(shape)
    return engine.place_one(demand)


def _age_seconds(as_of: datetime) -> int:
    return max(0, int((timezone.now() - as_of).total_seconds()))


def order_never_fits(order, sizing) -> dict | None:
    """The submission's check ({code, message, details}) when no node of the inventory could ever hold the order;
    None when one could. One query while the inventory is unchanged (`inventory_types`)."""
    return _never_fits_reason(inventory_types(), order, sizing)


def orders_never_fit(orders) -> list[dict | None]:
    """`order_never_fits` for each (order, sizing), over one read of the inventory (the catalog asks it of every
    option on the page). An empty inventory (nothing imported yet) marks nothing."""
    nodes = inventory_types()
    if not nodes:
        return [None for _ in orders]
    return [_never_fits_reason(nodes, order, sizing) for order, sizing in orders]


# What "could it ever fit" depends on: the nodes, their devices and the slice profiles (whose shares the devices
# offer), as the engine reads them (cluster_state). On PostgreSQL the cluster change log's triggers note every such
# change (rows of kind "node" or "all"; its ids are never reused, even after a rollback): the newest of them is the
# version, one index read. On the SQLite demo, which has no change log: the counts and highest ids of nodes and
# devices (an insert or delete moves them), their latest updated_at (save() and the inventory import's bulk update
# both set it), and the slice profiles.
def _inventory_version_sql() -> str:
    if connection.vendor == "postgresql":
        return f"SELECT max(id) FROM {cluster_state.LOG} WHERE kind <> 'allocation'"
    nodes, devices, profiles = Node._meta.db_table, Device._meta.db_table, SliceProfile._meta.db_table
    return f"""
SELECT (SELECT count(*) FROM {nodes}), (SELECT max(id) FROM {nodes}), (SELECT max(updated_at) FROM {nodes}),
       (SELECT count(*) FROM {devices}), (SELECT max(id) FROM {devices}), (SELECT max(updated_at) FROM {devices}),
       (SELECT group_concat(sig, ';') FROM (
          SELECT id, id || ',' || accelerator_id || ',' || name || ',' || compute_fraction AS sig
            FROM {profiles} ORDER BY id) AS signatures)
"""


_types: dict = {}  # this process's inventory types and the version they were read at


def inventory_types() -> list[NodeView]:
    """The inventory's nodes, one of each type (the first by name, which a reason then names), read again only when
    the inventory changed. Whether an order could ever fit needs only what an empty node offers, and a fleet of
    thousands of nodes is a few types: a submission then costs one small query, not every node and device (7,400
    rows at 1,213 nodes, 74,000 at 12,130) turned into engine objects."""
    with connection.cursor() as cursor:
        cursor.execute(_inventory_version_sql())
        version = cursor.fetchone()
    if _types.get("version") != version:
        _types.update(version=version, nodes=_one_of_each_type(load_inventory()))
    return _types["nodes"]


def _one_of_each_type(nodes: list[NodeView]) -> list[NodeView]:
    """The first node of each size, device make-up and capabilities, in inventory order (the first of a size stays
    first)."""
    first: dict[tuple, NodeView] = {}
    for node in nodes:
        devices = tuple(
            (
                device.model,
                device.vendor,
                device.memory_mib,
                device.capacity,
                tuple(sorted(device.slice_profiles.items())),
            )
            for device in node.devices
        )
        first.setdefault((node.cpu_milli, node.memory_mib, devices, node.capabilities), node)
    return list(first.values())


def _never_fits_reason(nodes, order, sizing) -> dict | None:
    models = order_models(order)
    runs_gangs = any(backends.MULTI_NODE_CAPABILITY in node.capabilities for node in nodes)
    never = unplaceable(nodes, _judged_anywhere(order_demand(order, sizing, models), runs_gangs=runs_gangs))
    if never is None:
        return None
    message = _sentence(named(never.message, models))
    return {"code": never.reason, "message": message, "details": dict(never.numbers)}


def _sentence(reason: str) -> str:
    """An engine reason ("needs ...; ...") as a sentence of its own."""
    return f"{reason[:1].upper()}{reason[1:]}."
