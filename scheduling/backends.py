"""Whether each execution backend answers as a whole: an outage of a backend (a Slurm controller stopped or
restarting, slurmrestd gone) marks it degraded instead of failing work or cordoning nodes. While it is degraded the
scheduling cycle keeps new placements off its nodes (they wait with `backend_unavailable` and the backend's
sentence); the first answer clears it and the queue is placed again.

Who marks it: whoever asks the backend and gets "not now" for the whole of it (the provisioning steps, the
reconciler, the watcher that asks it again while it is out); the first answer any of them gets clears it. Each
change is audited and announced after its commit (`backend_availability_changed`).
"""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from scheduling.models import BackendStatus, Node
from scheduling.signals import backend_availability_changed
from tenancy.services import audit_record

BACKEND_UNAVAILABLE = "backend_unavailable"  # the queue reason of work that waits for a degraded backend
MULTI_NODE_BACKEND = "multi_node_backend"  # the queue reason of a multi-node gang while no backend can run one

# The execution backends that run one piece of work over several nodes at once (a multi-node gang): Slurm, as one
# job of N nodes; containers, one per member started together with the rendezvous environment. The cycle places
# gangs only on their nodes (each offers MULTI_NODE_CAPABILITY, which a gang's demand needs); while none is in the
# inventory an approved gang waits with `multi_node_reason` instead of being placed and then failing at provisioning.
MULTI_NODE_BACKENDS: frozenset[str] = frozenset({"container", "slurm"})
MULTI_NODE_CAPABILITY = "runs:multi-node"  # what a node of such a backend offers the engine, and a gang needs


def backend_unavailable(*, backend: str, cause: dict) -> BackendStatus:
    """The backend did not answer (`cause`: {code, message, part}). The first such answer of an outage marks it
    degraded (audited, announced); later ones only keep the latest cause."""
    BackendStatus.objects.get_or_create(backend=backend)
    with transaction.atomic():
        status = BackendStatus.objects.select_for_update().get(backend=backend)
        status.cause = {key: cause.get(key, "") for key in ("code", "message", "part")}
        began = status.unavailable_since is None
        if began:
            status.unavailable_since = timezone.now()
        status.save(update_fields=["cause", "unavailable_since"])
        if began:
            audit_record(actor=None, action="backend.unavailable", target=status, reason=status.message)
            _announce(backend, available=False)
    return status


def backend_answered(*, backend: str) -> BackendStatus | None:
    """The backend answered: an outage it was in is over (audited, announced). One query when it was not in one."""
    with transaction.atomic():
        status = BackendStatus.objects.select_for_update().filter(backend=backend, unavailable_since__isnull=False)
        status = status.first()
        if status is None:
            return None
        lasted = timezone.now() - status.unavailable_since
        status.unavailable_since, status.recovered_at, status.watched_until = None, timezone.now(), None
        status.save(update_fields=["unavailable_since", "recovered_at", "watched_until"])
        audit_record(
            actor=None,
            action="backend.answering",
            target=status,
            reason=f"{status.get_backend_display()} answers again after {lasted.total_seconds():.0f} s.",
            data={"seconds": round(lasted.total_seconds(), 1)},
        )
        _announce(backend, available=True)
    return status


def backend_watch_lease(*, backend: str, seconds: float, renew: bool) -> bool:
    """Take (renew=False: only when no task holds it) or renew the lease of the one task asking a degraded backend
    again; False when the backend answers again, or (taking) another task holds the lease."""
    now = timezone.now()
    degraded = BackendStatus.objects.filter(backend=backend, unavailable_since__isnull=False)
    if not renew:
        degraded = degraded.exclude(watched_until__gt=now)
    return bool(degraded.update(watched_until=now + timedelta(seconds=seconds)))


def backends_unwatched() -> list[str]:
    """Degraded backends whose watcher's lease lapsed (its worker died): the reconciler starts one again."""
    now = timezone.now()
    degraded = BackendStatus.objects.filter(unavailable_since__isnull=False).exclude(watched_until__gt=now)
    return list(degraded.values_list("backend", flat=True))


def _announce(backend: str, *, available: bool) -> None:
    transaction.on_commit(
        lambda: backend_availability_changed.send(sender=BackendStatus, backend=backend, available=available)
    )


# --- Reads ---------------------------------------------------------------------------------------------------------


def unavailable_backends() -> dict[str, BackendStatus]:
    """The degraded backends by name (one query)."""
    return {status.backend: status for status in BackendStatus.objects.filter(unavailable_since__isnull=False)}


def unavailable_nodes(statuses: dict[str, BackendStatus] | None = None) -> dict[str, BackendStatus]:
    """The nodes of degraded backends, by name, with their backend's status: one query, two when one is degraded."""
    statuses = unavailable_backends() if statuses is None else statuses
    if not statuses:
        return {}
    nodes = Node.objects.filter(execution_backend__in=statuses).values_list("name", "execution_backend")
    return {name: statuses[backend] for name, backend in nodes}


def runs_multi_node() -> bool:
    """Whether some backend here can run a multi-node gang (no query while none declares it can)."""
    return bool(MULTI_NODE_BACKENDS) and Node.objects.filter(execution_backend__in=MULTI_NODE_BACKENDS).exists()


def node_capabilities(execution_backend: str) -> frozenset[str]:
    """What a node offers the engine by its execution backend: a gang's members go only where the job of all of
    them can run."""
    return frozenset({MULTI_NODE_CAPABILITY}) if execution_backend in MULTI_NODE_BACKENDS else frozenset()


def multi_node_reason(*, nodes: int) -> dict:
    """The queue reason of a multi-node gang while no backend here runs multi-node work: {code, message, numbers}."""
    return {
        "code": MULTI_NODE_BACKEND,
        "message": f"needs {nodes} nodes at once; no node here has a backend that runs multi-node work "
        f"({', '.join(sorted(MULTI_NODE_BACKENDS))}), so it waits rather than start on some of its nodes and fail",
        "numbers": {"nodes": nodes, "backends": sorted(MULTI_NODE_BACKENDS)},
    }


def waiting_reason(status: BackendStatus) -> dict:
    """The queue reason of work that waits for this backend: {code, message, numbers}."""
    return {
        "code": BACKEND_UNAVAILABLE,
        "message": status.message,
        "numbers": {"backend": status.backend, "since": status.unavailable_since.isoformat()},
    }
