"""The interface every provisioning driver implements, and the outcomes a driver call can have.

A driver does one side effect per call and must be idempotent: a step interrupted by a dying worker is run
again by another one, so a call must cope with finding its work already (partly) done.

Two families of operations:
- out-of-band, through the server's BMC (power, boot override, virtual media, hardware inventory): the
  `simulated` driver and the `redfish` driver (DMTF Redfish over HTTP);
- on the allocated node: a compute workload through the workload driver of the node's execution backend
  (`Node.execution_backend`: `simulated`, `slurm` for jobs through slurmrestd, `container` for podman; a
  Kubernetes backend would be one more WorkloadDriver); a bare-metal server's post-install steps (GPU driver,
  monitoring agent, cluster registration, health checks) through the in-band driver; a model-serving
  replica's inference server through the serving driver.
"""

import functools
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TypeVar

from django.db import connections

from catalog.choices import SlurmMembership

# Redfish `ProcessorType`s that count as the server's accelerators (cards in the inventory).
ACCELERATOR_TYPES = frozenset({"GPU", "Accelerator"})
NOT_IN_LOGIN_NAME = re.compile(r"[^a-z0-9_-]")
# The most threads a process keeps for calls side by side (`in_lanes`); it starts them as calls first need them.
KEPT_THREADS = 32
Item, Result = TypeVar("Item"), TypeVar("Result")


def login_name(username: str) -> str:
    """The requester's account on a workspace or server: a login name useradd accepts, made from their username."""
    name = NOT_IN_LOGIN_NAME.sub("_", username.lower())[:32]
    return name if name[:1].isalpha() else f"u{name}"[:32]


@dataclass(frozen=True)
class Target:
    """What a step acts on: the allocation's node and devices, and the request's frozen snapshot."""

    run_id: int
    request_id: int
    node: str
    # {index, uuid, model, model_slug, milli, mig: None or the GPU instance, mig_changes: {destroy, mode} or {}}
    devices: tuple[dict, ...]
    snapshot: dict
    bmc_address: str = ""
    bmc_credentials_ref: str = ""
    bmc_inventory_address: str = ""  # where the hardware inventory is read, when not from the BMC itself
    os_address: str = ""  # where the installed server answers SSH (in-band steps); empty: the node's name
    ssh_credentials_ref: str = ""
    # What the platform believes: cpu_cores, memory_gb, accelerators, accelerator_serials [{index, serial}].
    inventory: dict = field(default_factory=dict)
    attempt: int = 1
    backend: str = "simulated"  # the node's execution backend, which picked the host driver
    allocation_id: int = 0  # one request can hold several allocations over its life (preemption, retry)
    requester: str = ""  # the requester's username, the account a workspace gives them
    # The request's term in hours: the approved duration plus the extensions approved since (0: the snapshot's).
    duration_hours: int = 0
    # A multi-node gang's members in member order, the leader (this target's allocation) first: {member, node,
    # allocation_id, devices (as above)}; empty for work on one node. The leader's run starts the one job of all.
    gang: tuple[dict, ...] = ()

    @property
    def nodes(self) -> list[str]:
        """The nodes the work runs on: every member's, or the one node."""
        return [member["node"] for member in self.gang] or [self.node]

    @property
    def term_hours(self) -> int:
        return self.duration_hours or int(self.snapshot["duration_hours"])


def node_share(target: Target) -> tuple[int, int]:
    """The CPU cores and memory (MiB) the work gets on each of its nodes: the order's are the whole gang's."""
    demand, count = target.snapshot["demand"], len(target.nodes)
    return max(1, int(demand["cpu_cores"]) // count), int(demand["memory_gb"]) * 1024 // count


def member_target(target: Target, member: dict) -> Target:
    """The leader's target narrowed to one member of its gang: that member's node, devices and allocation."""
    return replace(target, node=member["node"], devices=member["devices"], allocation_id=member["allocation_id"])


def slurm_membership(target: Target) -> str:
    """How the bare-metal server joins Slurm (catalog.choices.SlurmMembership); a snapshot from before profiles said
    so joined the shared cluster, and its tenant got no root."""
    return target.snapshot["bare_metal_profile"].get("slurm_membership", SlurmMembership.SHARED_CLUSTER_NO_ROOT)


def tenant_cluster_name(target: Target) -> str:
    """The name of the one-server Slurm cluster a tenant_cluster server runs: its project's and its own."""
    name = re.sub(r"[^a-z0-9]+", "-", f"{target.snapshot.get('project', '')}-{target.node}".lower()).strip("-")
    return name[:60] or "cluster"


def visible_uuid(device: dict) -> str:
    """What work is bound by: the MIG device UUID of its GPU instance, else the card's UUID."""
    mig = device.get("mig")
    return mig["uuid"] if mig and mig.get("uuid") else device["uuid"]


class StepError(Exception):
    """A driver call failed. `retryable` failures are tried again with backoff until the step's attempts run out."""

    def __init__(self, code: str, message: str, *, retryable: bool = True, details: dict | None = None):
        super().__init__(message)
        self.code, self.message, self.retryable, self.details = code, message, retryable, details or {}


class BackendUnavailable(StepError):
    """The backend did not answer, or answered "not now": unreachable, restarting, busy, not yet registered. Never a
    final answer, so never a failure while the outage lasts: the engine tries the step again with backoff, for a
    provisioning step within the operator's outage budget (PROVISIONING_OUTAGE_BUDGET_SECONDS) and for a teardown
    until it succeeds, shows "waiting for <waiting_for> since ..." on the request, and isolates no node for it.

    Every driver classifies its backend's answers into this or a refusal (a plain StepError) in one place: Slurm's
    client (scheduling/slurm/api.py) for slurmrestd and slurmctld, the Redfish driver for BMCs, the container driver
    for podman. `whole_backend`: every node of the backend is out of reach at once (a Slurm controller), so the
    backend is marked degraded and new placements onto it wait; otherwise only this node's own service is (its
    podman, its BMC), a matter for that node's steps alone."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        backend: str,
        waiting_for: str,
        whole_backend: bool = False,
        details: dict | None = None,
    ):
        self.backend, self.waiting_for, self.whole_backend = backend, waiting_for, whole_backend
        outage = {"backend": backend, "waiting_for": waiting_for, "whole_backend": whole_backend}
        super().__init__(code, message, retryable=True, details={**(details or {}), "outage": outage})


def scontrol_outage(error: Exception) -> BackendUnavailable:
    """slurmctld out of reach for scontrol (scheduling.slurm.scontrol.ScontrolUnreachable): the same outage as for
    slurmrestd, waited out, never a failure."""
    return BackendUnavailable(
        "slurm_unavailable", str(error), backend="slurm", waiting_for="slurmctld", whole_backend=True
    )


def with_details(error: StepError, **details) -> StepError:
    """The same error (of the same class: an outage stays an outage) with more details, e.g. `isolate`."""
    copy = type(error).__new__(type(error), error.message)
    copy.__dict__.update(error.__dict__, details={**error.details, **details})
    copy.args = error.args
    return copy


class StepPending(Exception):
    """Not done yet (a power transition, an installer): ask again after `retry_after` seconds. `reason` is why the
    backend holds the work back ({code, message, details}, e.g. Slurm keeping a job pending), for the request."""

    def __init__(self, message: str, *, retry_after: float, reason: dict | None = None):
        super().__init__(message)
        self.message, self.retry_after, self.reason = message, retry_after, reason


class PlacementLost(Exception):
    """The backend will not start the work where the platform placed it (Slurm drained the node, or has it down,
    before the job started): nothing runs there yet, so rather than failing or waiting for the node, the request
    goes back to the queue to be placed again where it can run. `reason` ({code, message, details}) goes on its
    timeline."""

    def __init__(self, reason: dict):
        super().__init__(reason["message"])
        self.reason = reason


@dataclass(frozen=True)
class WorkloadEnd:
    """How a workload ended by itself, as its backend tells it."""

    state: str  # the backend's own word, e.g. Slurm's COMPLETED, FAILED, TIMEOUT, NODE_FAIL, CANCELLED
    failed: bool  # the request fails (exit code, node failure) rather than being released
    message: str  # a sentence for the timeline, with the backend's reason and exit code
    details: dict = field(default_factory=dict)


def each(
    call: Callable[[Target, dict], dict], items: list[tuple[Target, dict]], *, side_by_side: int = 1
) -> list[dict | Exception]:
    """`call` on each (target, argument), its exception standing for the output of the one that raised; up to
    `side_by_side` calls at once (`in_lanes`), for a backend whose calls wait on the node."""
    return in_lanes(lambda item: outcome_of(call, *item), items, side_by_side)


def in_lanes(call: Callable[[Item], Result], items: Sequence[Item], at_once: int) -> list[Result]:
    """call(item) of every item, up to `at_once` at a time, the results in the items' order: the calling thread and
    up to at_once - 1 of the process's kept threads (`_kept_threads`) each take the next item until none is left.
    The caller takes its share and waits for no kept thread that has not begun by then, so the calls go on even
    while every kept thread is busy elsewhere (a call side by side inside another waits for nothing). Every item is
    called; the first exception a call raised is raised once all are done. A call that uses the database does so on
    its thread's own connection, which a kept thread closes when its lane is done."""
    results: list = [None] * len(items)
    errors: list[Exception] = []
    pending = iter(enumerate(items))
    taking = threading.Lock()

    def lane() -> None:
        while True:
            with taking:
                position, item = next(pending, (None, None))
            if position is None:
                return
            try:
                results[position] = call(item)
            except Exception as error:  # the others still run; the caller gets it once they are done
                errors.append(error)

    def kept_lane() -> None:
        try:
            lane()
        finally:
            connections.close_all()  # this thread's own, if a call opened one: kept threads hold none between calls

    helpers = [_kept_threads().submit(kept_lane) for _ in range(min(at_once, len(items)) - 1)]
    lane()
    wait([helper for helper in helpers if not helper.cancel()])  # one not begun yet would find nothing left to take
    if errors:
        raise errors[0]
    return results


@functools.cache
def _kept_threads() -> ThreadPoolExecutor:
    """The process's threads for calls side by side, started as first needed and then kept: on a busy machine a new
    thread takes milliseconds to tens of milliseconds to start (it must get a core and the GIL), and a batch's
    look at its Slurm jobs started eight in turn, each before its query could go out. A forked process (a
    django-q worker) makes its own: the parent's threads do not exist there."""
    return ThreadPoolExecutor(max_workers=KEPT_THREADS, thread_name_prefix="side-by-side")


os.register_at_fork(after_in_child=_kept_threads.cache_clear)


def outcome_of(call: Callable[..., dict], *arguments) -> dict | Exception:
    """What `call` returns, or the exception it raised: one run's outcome, which the engine records as that
    attempt's, whatever happens to the others of its batch."""
    try:
        return call(*arguments)
    except Exception as error:  # the engine turns it into that attempt's outcome
        return error


def only(results: list[dict | Exception]) -> dict:
    """The output of a batch of one; its exception raised."""
    (result,) = results
    if isinstance(result, Exception):
        raise result
    return result


class BmcDriver(ABC):
    """Out-of-band control of a whole server. Every method returns a JSON-able summary for the step's output."""

    name: str

    @abstractmethod
    def inventory(self, target: Target) -> dict:
        """{reachable, health, power_state, cpu_cores, memory_gb, accelerators, processors: [{id, type, model,
        serial, cores, health}]}; None for what the BMC does not report."""

    @abstractmethod
    def insert_media(self, target: Target, image_url: str) -> dict:
        """Insert the OS installer as virtual media (no-op when that image is already inserted)."""

    @abstractmethod
    def set_one_time_boot(self, target: Target, source: str) -> dict:
        """Boot once from `source` ("Cd" for virtual media, "Pxe" for network boot)."""

    @abstractmethod
    def power_state(self, target: Target) -> str:
        """ "On", "Off", or a transitional state such as "PoweringOn"."""

    @abstractmethod
    def power(self, target: Target, action: str) -> dict:
        """Request a power action: "On", "ForceOff", "ForceRestart", "GracefulShutdown"."""

    @abstractmethod
    def eject_media(self, target: Target) -> dict:
        """Eject any inserted virtual media (no-op when none)."""

    def close(self) -> None:  # noqa: B027  (optional hook: most drivers hold no connections)
        """Let go of connections (the step is done with the driver)."""


class WorkloadDriver(ABC):
    """Runs a compute order's workload on the allocated node; one per execution backend (`Node.execution_backend`:
    simulated, slurm, container). The approved snapshot reaches it unchanged, in `target.snapshot`."""

    name: str
    # prepare_image asks the node or the backend something (pulls, verifies); False when it only computes what the
    # run will start (the engine then does the step in its neighbour's transaction, provisioning/pipelines.py).
    image_step_calls: bool = True

    @abstractmethod
    def prepare_image(self, target: Target, image: dict) -> dict:
        """Make the approved image available on the node (pull or build, and verify). This and the two steps after
        it raise PlacementLost when the backend will not start work on the node any more."""

    @abstractmethod
    def start_workload(self, target: Target, image: dict) -> dict:
        """Start (or find already started) the workload with the allocated devices bound: {workload, host, ports}."""

    @abstractmethod
    def workload_ready(self, target: Target, started: dict) -> dict:
        """Raise StepPending until the workload that start_workload reported (`started`, its output) answers its
        readiness probe."""

    @abstractmethod
    def stop_workload(self, target: Target) -> dict:
        """Stop and remove the workload (no-op when it is gone)."""

    def connect_secret_names(self, target: Target) -> tuple[str, ...]:
        """The secrets the started workload is reached with, by the access entry each opens (a workspace running
        Jupyter: ("jupyter",)). The platform issues each, keeps it for the requester alone (provisioning/connect.py)
        and hands it to connect_secret_set; a workload reached without one (SSH with the order's key, srun) has
        none."""
        return ()

    def connect_secret_set(self, target: Target, name: str, value: str) -> None:
        """Make the running workload accept `value` as its `name` secret, and no earlier one. The value reaches no
        command line, log or output. Raises StepError when the workload cannot take it."""
        raise StepError(
            "connect_secret_unsupported", f"The {self.name} backend keeps no {name} secret.", retryable=False
        )

    # The same for a batch of runs at one step: [(target, image or started)] -> [output, or the StepError,
    # StepPending or other exception of each], in order. A backend that can ask once for all of them (one Slurm job
    # list for ten submissions) overrides these; by default each is asked on its own.

    def prepare_images(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        return each(self.prepare_image, items)

    def start_workloads(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        return each(self.start_workload, items)

    def workloads_ready(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        return each(self.workload_ready, items)

    def ended_workloads(self, targets: Iterable[Target]) -> dict[int, WorkloadEnd]:
        """The reconciler's question: which of these running workloads (by allocation id) have ended by themselves,
        and how. A backend whose workloads never end on their own (the simulated one) has none. Raises StepError
        when the backend cannot be asked, so nothing is reclaimed on a guess."""
        return {}

    def extend_workloads(self, targets: Iterable[Target]) -> dict[int, dict]:
        """Move the end this backend enforces on each workload (a Slurm job's time limit) out to its request's
        term (`target.term_hours`) where it is shorter; {allocation_id: what changed} for those moved. A backend
        that enforces no end of its own (the platform's expiry releases the workload) moves nothing. Raises
        StepError when the backend cannot be asked or refuses."""
        return {}

    def probe(self) -> None:  # noqa: B027  (optional: most backends have no whole to ask)
        """Ask the backend as a whole whether it answers (a Slurm controller); BackendUnavailable when it does not.
        A backend without a whole to ask (each node's own service) always answers here."""

    def stop_orphans(self, still_held: Callable[[set[int]], set[int]]) -> list[dict]:
        """Stop this platform's workloads whose allocation is no longer held (a teardown that could not reach the
        backend left them running): `still_held` says which of the allocation ids the backend's workloads name are
        held (asked after the backend was read, so an allocation made meanwhile is held). Returns
        [{request_id, allocation_id, workload}] of those stopped."""
        return []


class InBandDriver(ABC):
    """The post-install steps of a bare-metal server, run on the delivered server itself."""

    name: str

    @abstractmethod
    def install_gpu_driver(self, target: Target, version: str) -> dict: ...

    @abstractmethod
    def install_monitoring_agent(self, target: Target, agent: str, gpu_exporter: str = "") -> dict:
        """The agent (and the profile's GPU exporter, when it names one) installed, started and answering."""

    @abstractmethod
    def register_in_cluster(self, target: Target, cluster: str) -> dict:
        """Join Slurm as the profile's membership says (`slurm_membership(target)`): the shared `cluster` with its
        munge key, a cluster of the server's own with a key made there, or none."""

    @abstractmethod
    def grant_access(self, target: Target, *, ssh_public_keys: list[str], root: bool) -> dict:
        """The requester's account on the server accepting exactly `ssh_public_keys` (the order's key and the
        requester's profile keys: drivers.keys), root (sudo) or, checked, none at all: {user, ssh_keys, root}."""

    @abstractmethod
    def deregister_from_cluster(self, target: Target, cluster: str) -> dict: ...

    @abstractmethod
    def health_check(self, target: Target, checks: list[str]) -> dict:
        """Post-install checks (driver loaded, all accelerators visible, agent reporting, plus the profile's
        burn-in and collective-bandwidth checks when listed); StepError when one fails."""

    @abstractmethod
    def request_cleaning(self, target: Target) -> dict:
        """Queue the disk wipe and firmware reset that must happen before the server serves another tenant."""


class ServingDriver(ABC):
    """Starts and stops the inference servers of a model-serving deployment's replicas."""

    name: str

    @abstractmethod
    def start_inference(self, target: Target, replica: str, devices: list[dict], serving: dict) -> dict:
        """Start one inference server for a model-serving replica on its devices: {url, pid}."""

    @abstractmethod
    def stop_inference(self, target: Target, pid: int | None) -> dict:
        """Stop a replica's inference server (no-op when it is gone)."""
