"""Writes that keep our inventory and Slurm's in step (docs/inventory.md, "From Slurm").

- `slurm_inventory_import`: Slurm's nodes become Node/Device rows (execution_backend=slurm) through
  `inventory_import`; nodes Slurm no longer lists are cordoned, never deleted.
- `slurm_node_states_apply`: Slurm's DOWN/DRAIN/FAIL/NOT_RESPONDING states become health events and a cordon with
  Slurm's reason, lifted when Slurm has the node back. The import applies them, and so do the minute refresh
  (`slurm_node_states_refresh`) and the Slurm driver the moment an answer shows a node out of service.
- `slurm_node_sync`: the other direction. A cordoned node, or a node with an isolated card, is drained in Slurm with
  the same reason; once neither holds, a drain the platform set is resumed. Called by a task after the commit of the
  operator's action, so a Slurm outage never undoes it; every outcome is an audit row on the node.
"""

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import OuterRef, Q, Subquery
from django_q.tasks import async_task

from catalog.models import AcceleratorModel
from config.errors import DomainError
from scheduling.choices import ExecutionBackend, HealthSource
from scheduling.inventory.formats import DeviceRecord, NodeRecord, device_uuid
from scheduling.inventory.importer import ImportResult, inventory_import
from scheduling.models import Device, HealthEvent, Node
from scheduling.services import node_cordon, node_uncordon
from scheduling.slurm import scontrol
from scheduling.slurm.api import SlurmApi, SlurmApiError, SlurmNotFound
from scheduling.slurm.nodes import GresError, SlurmNodeState, parse_gpus
from scheduling.wiring import SLURM_SYNC_TASK
from tenancy.models import AuditEvent, User
from tenancy.services import audit_record

logger = logging.getLogger(__name__)

# The GRES "type" of an untyped `gpu:<n>`, as a key of the GPU model mapping.
UNTYPED_GPU = "gpu"
VANISHED_REASON = "Slurm no longer lists this node (cordoned by the Slurm import; never deleted)"
# Cordons the import set itself, and so may lift when Slurm reports the node in service again.
IMPORT_CORDON_PREFIXES = ("Slurm reports the node ", VANISHED_REASON)
STATE_SIGNAL = "node_state"
NOT_CONFIGURED = "Slurm not configured (SLURM_REST_URL is empty)"
DRAINED_ACTION = "node.slurm_drained"


# --- Slurm -> inventory ----------------------------------------------------------------------------------------


@dataclass
class NodeStateChanges:
    cordoned: list[str] = field(default_factory=list)  # "node: reason"
    uncordoned: list[str] = field(default_factory=list)
    health_events: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.cordoned or self.uncordoned or self.health_events)

    def summary(self) -> str:
        return f"{len(self.cordoned)} cordoned, {len(self.uncordoned)} uncordoned, {self.health_events} health events"


@dataclass(kw_only=True)
class SlurmImportResult(NodeStateChanges):
    inventory: ImportResult

    @property
    def changed(self) -> bool:
        return self.inventory.changed or super().changed


def slurm_inventory_import(
    *,
    api: SlurmApi,
    gpu_models: dict[str, str],
    site: str = "",
    actor: User | None = None,
    topology: dict[str, tuple[str, str]] | None = None,
) -> SlurmImportResult:
    """Import every node slurmrestd lists. `gpu_models` maps a Slurm GRES type ("a100", or "gpu" for untyped GPUs)
    to a catalog accelerator model slug or name; a type it does not map must itself be a model's slug or name.
    Unknown types refuse the whole import (DomainError listing them). `topology` (slurm.topology.parse_topology:
    node -> (leaf switch, its parent)) files each node in that rack and block. A second run changes nothing."""
    slurm_nodes = api.nodes()  # before the transaction: no row is locked while Slurm answers
    with transaction.atomic():
        records = _node_records(slurm_nodes, gpu_models, topology or {})
        result = SlurmImportResult(inventory=inventory_import(records=records, actor=actor, default_site=site))
        slurm_node_states_apply(slurm_nodes=slurm_nodes, changes=result, actor=actor)
        _resync_drains_out_of_step(slurm_nodes)
        _cordon_vanished({record.name for record in records}, site, result, actor)
    return result


def slurm_inventory_refresh() -> str:
    """The periodic import (schedule "Import inventory from Slurm"): the configured cluster, GPU mapping and site
    (SLURM_REST_URL, SLURM_GPU_MODELS, SLURM_SITE), so new nodes, changed GRES and vanished nodes reach the inventory
    without an operator running the command. Does nothing while SLURM_REST_URL is empty; a refusal is logged, not
    raised (the next run tries again). Returns what happened, for the task's result."""
    if not settings.SLURM_REST_URL:
        return NOT_CONFIGURED
    try:
        with SlurmApi.from_settings() as api:
            result = slurm_inventory_import(api=api, gpu_models=settings.SLURM_GPU_MODELS, site=settings.SLURM_SITE)
    except (SlurmApiError, DomainError) as error:
        logger.warning("Slurm inventory import refused: %s", error)
        return f"refused: {error}"
    return f"{result.inventory.nodes_created} created, {result.inventory.nodes_updated} updated, {result.summary()}"


def slurm_node_states_refresh() -> str:
    """The minute task (schedule "Read node states from Slurm"): one `GET /nodes` and Slurm's service states onto the
    inventory, so a drain reaches placement within a minute rather than at the five-minute import (which also
    writes CPUs, memory and GRES). Does nothing while SLURM_REST_URL is empty; Slurm out of reach is logged and
    changes nothing (the next minute asks again). Returns what happened, for the task's result."""
    if not settings.SLURM_REST_URL:
        return NOT_CONFIGURED
    try:
        with SlurmApi.from_settings() as api:
            slurm_nodes = api.nodes()
    except SlurmApiError as error:
        logger.warning("Slurm node states not read: %s", error)
        return f"not read: {error}"
    return slurm_node_states_apply(slurm_nodes=slurm_nodes).summary()


def slurm_node_states_apply(
    *, slurm_nodes: list[dict], changes: NodeStateChanges | None = None, actor: User | None = None
) -> NodeStateChanges:
    """Slurm's service state of each node it listed (its `nodes` objects) onto our Slurm-backed node of that name:
    a node Slurm starts no work on is cordoned with Slurm's reason, the import's own cordon is lifted once Slurm has
    the node back (the uncordon wakes the scheduler), and each change of Slurm's state is recorded as a health event
    on the node's devices. Nodes the inventory does not have are the import's to create.

    One query reads the nodes with the state recorded last; only a node whose state moved is then locked, decided
    again and written, in a transaction of its own: a minute's refresh of a pool where nothing moved writes nothing,
    and the import, the refresh and a driver applying the same news at once cordon a node once."""
    changes = changes if changes is not None else NodeStateChanges()
    states = {slurm_node["name"]: SlurmNodeState.of(slurm_node) for slurm_node in slurm_nodes}
    recorded = HealthEvent.objects.filter(
        device__node=OuterRef("pk"), source=HealthSource.SLURM, signal=STATE_SIGNAL
    ).values("value")[:1]
    nodes = Node.objects.filter(execution_backend=ExecutionBackend.SLURM, name__in=states).annotate(
        recorded_state=Subquery(recorded)
    )
    for node in nodes.order_by("pk"):
        state = states[node.name]
        if _state_moved(node, state, node.recorded_state):
            with transaction.atomic():
                _apply_state(Node.objects.select_for_update().get(pk=node.pk), state, changes, actor)
    return changes


def _node_records(
    slurm_nodes: list[dict], gpu_models: dict[str, str], topology: dict[str, tuple[str, str]]
) -> list[NodeRecord]:
    models = _models_by_gres_type(slurm_nodes, gpu_models)
    serials = dict(Node.objects.filter(name__in=[n["name"] for n in slurm_nodes]).values_list("name", "serial_number"))
    records = []
    for slurm_node in slurm_nodes:
        name = slurm_node["name"]
        gpu_types = [
            gpu.gpu_type or UNTYPED_GPU for gpu in parse_gpus(slurm_node.get("gres", "")) for _ in range(gpu.count)
        ]
        records.append(
            NodeRecord(
                name=name,
                # Slurm knows no serial numbers: a node imported before keeps its own.
                serial_number=serials.get(name, f"slurm:{name}"),
                cpu_milli=int(slurm_node["cpus"]) * 1000,
                memory_mib=int(slurm_node["real_memory"]),
                devices=[
                    DeviceRecord(index=index, model=models[gpu_type], uuid=device_uuid(name, index))
                    for index, gpu_type in enumerate(gpu_types)
                ],
                execution_backend=ExecutionBackend.SLURM,
                rack=topology.get(name, ("", ""))[0],
                block=topology.get(name, ("", ""))[1],
                where=f"Slurm node {name}",
            )
        )
    return records


def _models_by_gres_type(slurm_nodes: list[dict], gpu_models: dict[str, str]) -> dict[str, str]:
    """GRES type -> catalog model slug; refuses with every unknown type and the nodes that have it."""
    types: dict[str, list[str]] = {}
    problems = []
    for slurm_node in slurm_nodes:
        try:
            gpus = parse_gpus(slurm_node.get("gres", ""))
        except GresError as error:
            problems.append(f"{slurm_node['name']}: {error}")
            continue
        for gpu in gpus:
            types.setdefault(gpu.gpu_type or UNTYPED_GPU, []).append(slurm_node["name"])
    if problems:
        raise DomainError("; ".join(problems), code="unreadable_gres", details={"problems": problems})
    wanted = {gpu_type: gpu_models.get(gpu_type, gpu_type) for gpu_type in types}
    catalog = {}
    for model in AcceleratorModel.objects.filter(
        Q(slug__in=[w.lower() for w in wanted.values()]) | Q(name__in=wanted.values())
    ):
        catalog[model.slug] = catalog[model.name] = model.slug
    found = {gpu_type: catalog.get(model) or catalog.get(model.lower()) for gpu_type, model in wanted.items()}
    unknown = sorted(gpu_type for gpu_type, slug in found.items() if slug is None)
    if unknown:
        listed = [f"{gpu_type} (on {', '.join(sorted(set(types[gpu_type])))})" for gpu_type in unknown]
        raise DomainError(
            f"Slurm GPU types with no catalog accelerator model: {'; '.join(listed)}. Map each to a model with "
            f"--gpu-model TYPE=SLUG (or SLURM_GPU_MODELS), or add the model to the catalog.",
            code="unknown_slurm_gpu_type",
            details={"types": unknown, "nodes": {gpu_type: sorted(set(types[gpu_type])) for gpu_type in unknown}},
        )
    return found


def _state_moved(node: Node, state: SlurmNodeState, recorded: str | None) -> bool:
    """Whether Slurm's state may change something on the node (decided for sure on its locked row)."""
    cordon_to_lift = not node.schedulable and node.cordon_reason.startswith(IMPORT_CORDON_PREFIXES)
    return (
        _state_news(state, recorded)
        or (state.unavailable and node.schedulable)
        or (not state.unavailable and cordon_to_lift)
    )


def _state_news(state: SlurmNodeState, recorded: str | None) -> bool:
    """A state differing from the one recorded last (none recorded yet: only a node out of service is news)."""
    return recorded != state.event_value and (recorded is not None or state.unavailable)


def _apply_state(node: Node, state: SlurmNodeState, changes: NodeStateChanges, actor: User | None) -> None:
    """Cordon a node Slurm keeps out of service, lift the import's own cordon once Slurm has it back, and record
    each change of Slurm's state as a health event on the node's devices. Our own drain echoing back is no news."""
    if state.unavailable and state.reason in _platform_reasons(node):
        return
    if state.unavailable and node.schedulable:
        node_cordon(node=node, reason=state.cordon_reason(), actor=actor)
        changes.cordoned.append(f"{node.name}: {state.cordon_reason()}")
    elif not state.unavailable and not node.schedulable and node.cordon_reason.startswith(IMPORT_CORDON_PREFIXES):
        node_uncordon(node=node, reason=f"Slurm reports the node {state.label} again", actor=actor)
        changes.uncordoned.append(node.name)
    changes.health_events += _record_state_event(node, state)


def _platform_reasons(node: Node) -> set[str]:
    """Reasons the platform itself gives Slurm for draining this node (slurm_node_sync)."""
    reasons = set(node.devices.filter(isolated=True).values_list("isolation_reason", flat=True))
    if not node.schedulable and not node.cordon_reason.startswith(IMPORT_CORDON_PREFIXES):
        reasons.add(node.cordon_reason)
    return reasons


def _record_state_event(node: Node, state: SlurmNodeState) -> int:
    """A health event per device when Slurm's state differs from the last one recorded (none yet: only when the
    node is out of service), so repeated imports record nothing new."""
    recorded = (
        HealthEvent.objects.filter(device__node=node, source=HealthSource.SLURM, signal=STATE_SIGNAL)
        .values_list("value", flat=True)
        .first()
    )
    if not _state_news(state, recorded):
        return 0
    events = [
        HealthEvent(device=device, source=HealthSource.SLURM, signal=STATE_SIGNAL, value=state.event_value)
        for device in Device.objects.filter(node=node)
    ]
    HealthEvent.objects.bulk_create(events)
    return len(events)


def _resync_drains_out_of_step(slurm_nodes: list[dict]) -> None:
    """A drain or resume that did not reach Slurm (it was down when the operator acted) is retried from here, so
    the import, run on a schedule, is also the reconciliation of drains."""
    nodes = Node.objects.in_bulk([slurm_node["name"] for slurm_node in slurm_nodes], field_name="name")
    for slurm_node in slurm_nodes:
        node, state = nodes[slurm_node["name"]], SlurmNodeState.of(slurm_node)
        wanted = _drain_reason(node)
        ours = state.drained and state.reason == _last_platform_drain(node)
        if (wanted is not None and not state.unavailable) or (wanted is None and ours):
            node_id = node.pk
            transaction.on_commit(lambda node_id=node_id: async_task(SLURM_SYNC_TASK, node_id))


def _cordon_vanished(listed: set[str], site: str, result: NodeStateChanges, actor: User | None) -> None:
    """Slurm-backed nodes (of the import's site, when it names one) that Slurm no longer lists."""
    vanished = Node.objects.filter(execution_backend=ExecutionBackend.SLURM, schedulable=True).exclude(name__in=listed)
    if site:
        vanished = vanished.filter(rack__site__name=site)
    for node in vanished:
        node_cordon(node=node, reason=VANISHED_REASON, actor=actor)
        result.cordoned.append(f"{node.name}: {VANISHED_REASON}")


# --- Inventory -> Slurm ----------------------------------------------------------------------------------------


def slurm_node_sync(*, node_id: int) -> str:
    """Bring the Slurm node to what our record says: drained while the node is cordoned or holds an isolated card
    (with that reason), resumed once neither holds, if the drain was ours. Returns the outcome (also audited).

    Reads our rows at run time, so syncs that run late or twice still converge on the latest state."""
    node = Node.objects.filter(pk=node_id, execution_backend=ExecutionBackend.SLURM).first()
    if node is None:
        return "not_slurm"
    wanted = _drain_reason(node)
    try:
        with SlurmApi.from_settings() as api:
            state = SlurmNodeState.of(api.node(node.name))
        outcome, reason = _converge(node, state, wanted)
    except SlurmNotFound:
        outcome, reason = "slurm_missing", "Slurm does not list this node; nothing to drain or resume"
    except (SlurmApiError, scontrol.ScontrolError) as error:
        outcome, reason = "slurm_sync_failed", str(error)
    audit_record(
        actor=None, action=f"node.{outcome}", target=node, reason=reason, data={"drain_wanted": wanted is not None}
    )
    return outcome


def _drain_reason(node: Node) -> str | None:
    if not node.schedulable:
        return node.cordon_reason
    isolated = node.devices.filter(isolated=True).order_by("index").values_list("isolation_reason", flat=True)
    return isolated.first()


def _converge(node: Node, state: SlurmNodeState, wanted: str | None) -> tuple[str, str]:
    if wanted is not None:
        if state.unavailable:
            return "slurm_drain_skipped", f"Slurm already has the node {state.label}: {state.reason}"
        scontrol.drain_node(node.name, wanted)
        return "slurm_drained", wanted
    if not state.drained:
        return "slurm_in_service", f"Slurm has the node {state.label}; nothing to resume"
    if state.reason != _last_platform_drain(node):
        return "slurm_resume_skipped", f"Drained in Slurm by someone else ({state.reason}); left drained"
    scontrol.resume_node(node.name)
    return "slurm_resumed", f"Resumed; it was drained for: {state.reason}"


def _last_platform_drain(node: Node) -> str | None:
    return (
        AuditEvent.objects.filter(
            target_type=ContentType.objects.get_for_model(Node), target_id=str(node.pk), action=DRAINED_ACTION
        )
        .values_list("reason", flat=True)
        .first()
    )
