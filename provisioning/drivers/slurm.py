"""The `slurm` execution backend: a compute order runs as a Slurm batch job, submitted through slurmrestd (REST API
v0.0.38, JWT; the client is scheduling/slurm/api.py).

How a job uses the approved image: Slurm runs a batch script on a node, not an image, and the nodes of a Slurm
pool carry their site's software stack (OS, driver, CUDA runtime), which the image catalog entry names. So the
job runs the image's contract on the node: its environment (`configuration.env`) plus CC_IMAGE /
CC_IMAGE_REFERENCE, and its command (`configuration.command`) when the image has one; an image without a command
is an interactive workspace, whose job holds the allocation until its time limit while the developer attaches
with `srun --jobid=<id> --pty bash`.

The platform chose the node and the devices; the job is pinned to that node (`nodelist`) with the GPU type and
count (`gres`), the order's CPUs and memory, and a time limit equal to the approved duration; an approved
extension raises it (`extend_workloads`: over REST, or with scontrol where Slurm lets only operators raise a limit).
Inside the node Slurm binds the GPU indexes itself (`gres_detail`): readiness reports them, and the allocation
follows Slurm.

Idempotent by name: the job is named after the request and its comment names the allocation, so a retried step
finds the job it already submitted; two workers submitting at once take turns on a per-request database lock
(PostgreSQL advisory lock; the SQLite demo serialises writers anyway) and the second finds the first one's job.
"""

import hashlib
import itertools
import logging
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction

from provisioning.drivers.base import (
    BackendUnavailable,
    PlacementLost,
    StepError,
    StepPending,
    Target,
    WorkloadDriver,
    WorkloadEnd,
    in_lanes,
    node_share,
    only,
    scontrol_outage,
    with_details,
)
from provisioning.models import ProvisioningStep
from scheduling.slurm import scontrol
from scheduling.slurm.api import (
    SlurmAccessDenied,
    SlurmApi,
    SlurmApiError,
    SlurmNotFound,
    SlurmUnavailable,
    configured_token,
    error_number,
)
from scheduling.slurm.nodes import SlurmNodeState
from scheduling.slurm.services import UNTYPED_GPU, slurm_node_states_apply
from scheduling.slurm.topology import expand_hostlist

logger = logging.getLogger(__name__)

# Slurm job states (squeue(1) "JOB STATE CODES") as slurmrestd v0.0.38 spells them.
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED"})
RUNNING = "RUNNING"
ENDING = "COMPLETING"  # the job is over but its processes are still being cleaned up; its final state follows
ENDED_WELL = {
    "COMPLETED": "completed",
    "CANCELLED": "was cancelled outside the platform",
    "TIMEOUT": "reached its time limit (the approved duration)",
}
ENDED_BADLY = {
    "FAILED": "failed",
    "NODE_FAIL": "ended because its node failed",
    "OUT_OF_MEMORY": "ran out of memory",
    "BOOT_FAIL": "could not boot its node",
    "DEADLINE": "missed its deadline",
    "PREEMPTED": "was preempted by Slurm",
}
# Why Slurm keeps a job pending (squeue(1) "JOB REASON CODES"), onto the platform's queue reason codes.
PENDING_REASONS = {
    "Resources": "capacity_in_use",
    "Priority": "higher_priority_ahead",
    "ReqNodeNotAvail": "insufficient_healthy_capacity",
    "NodeDown": "insufficient_healthy_capacity",
    "PartitionDown": "insufficient_healthy_capacity",
    "PartitionInactive": "insufficient_healthy_capacity",
    "BadConstraints": "no_matching_spec",
    "PartitionConfig": "no_matching_spec",
    "PartitionNodeLimit": "no_matching_spec",
    "PartitionTimeLimit": "no_matching_spec",
    "InvalidQOS": "no_matching_spec",
}
BACKEND_HOLD = "backend_hold"  # any other reason: a hold, a QOS or association limit, a dependency, a begin time
# Pending reasons that may mean the job's node is out of service (they also cover a reservation on a node in service,
# for which the job waits): the node's own state decides.
NODE_PENDING_REASONS = frozenset({"ReqNodeNotAvail", "NodeDown"})
# ESLURM_NODE_NOT_AVAIL, "Required node not available (down, drained or reserved)": Slurm's answer to a submission
# pinned to such a node. Slurm has accepted the job and holds it pending (ReqNodeNotAvail) all the same.
NODE_NOT_AVAILABLE_ERRNO = 2068
NODE_UNAVAILABLE = "backend_node_unavailable"  # the reason a request is placed again
POLL_SECONDS = 0.5  # between the engine's readiness attempts
WATCH_SECONDS, WATCH_EVERY_SECONDS = 2.0, 0.1  # within one attempt
START_STEP = "start_workload"  # the compute pipeline's step that submits the job (provisioning/pipelines.py)
SUBMIT_LOCK_NAMESPACE = 0x534C  # "SL": advisory locks of Slurm submissions, keyed by request id
HOLD_COMMAND = "exec sleep infinity"
PRIVATE_UMASK = "0077"
PROBE_TIMEOUT_SECONDS = 3.0  # a ping while slurmctld is down waits long in slurmrestd; the watcher asks again sooner


def job_name(request_id: int) -> str:
    return f"cc-request-{request_id}"


def reservation_name(request_id: int) -> str:
    """The Slurm reservation an advance reservation's job runs in (requests/reservations.py)."""
    return f"cc-reservation-{request_id}"


def reserved(target: Target) -> bool:
    """An advance reservation: its job runs inside a Slurm reservation over its whole nodes."""
    return bool(target.snapshot.get("reservation"))


def job_comment(target: Target) -> str:
    return f"compute-catalog request {target.request_id} allocation {target.allocation_id}"


JOB_COMMENT = re.compile(r"^compute-catalog request (?P<request>\d+) allocation (?P<allocation>\d+)$")


def attach_command(job_id: int) -> str:
    return f"srun --jobid={job_id} --pty bash"


def gpu_indexes(gres_detail: list[str]) -> list[int]:
    """The GPU indexes in Slurm's gres_detail, e.g. ["gpu:a100:2(IDX:0,2-3)"] -> [0, 2, 3]."""
    indexes = []
    for entry in gres_detail or []:
        match = re.search(r"\(IDX:([0-9,\-]+)\)", entry)
        for part in match.group(1).split(",") if match else []:
            first, _, last = part.partition("-")
            indexes += range(int(first), int(last or first) + 1)
    return sorted(indexes)


def started_at(job: dict) -> str | None:
    """When Slurm started the job (its `start_time`, seconds since the epoch; 0 or absent before it ran), ISO 8601."""
    start = job.get("start_time")
    return datetime.fromtimestamp(start, UTC).isoformat() if isinstance(start, int) and start > 0 else None


def exit_status(job: dict) -> tuple[int | None, int | None]:
    """(exit code, signal) from Slurm's exit_code, a wait(2) status as slurmctld keeps it."""
    raw = job.get("exit_code")
    if not isinstance(raw, int):
        return None, None
    return (raw >> 8) & 0xFF, raw & 0x7F


_clients: dict[tuple, SlurmApi] = {}
_clients_lock = threading.Lock()


def shared_api() -> SlurmApi:
    """One client per worker process and configuration, shared by its threads: building one costs tens of
    milliseconds (its TLS context), and its keep-alive connections save a handshake per call. A changed setting or a
    rotated token (SLURM_JWT_FILE is read on every use) replaces it."""
    key = (settings.SLURM_REST_URL, settings.SLURM_USER_NAME, configured_token(), settings.SLURM_TIMEOUT_SECONDS)
    with _clients_lock:
        api = _clients.get(key)
        if api is None:
            for replaced in _clients.values():
                replaced.close()
            _clients.clear()
            url, user_name, token, timeout = key
            api = _clients[key] = SlurmApi(url=url, user_name=user_name, token=token, timeout=timeout)
        return api


class SlurmWorkloads(WorkloadDriver):
    """A batch of runs at one step asks slurmrestd once where it can: one look per node, one job list for all the
    submissions, one watch over all the jobs starting. The one-run forms are the batch forms for one."""

    name = "slurm"
    image_step_calls = False  # the job runs on the node's own software: nothing to pull

    @contextmanager
    def _api(self):
        try:
            yield shared_api()
        except SlurmApiError as error:
            raise classified(error) from error

    def probe(self) -> None:
        """slurmctld answers a ping through slurmrestd (quickly: the watcher asks again while it does not)."""
        with self._api() as api:
            api.ping(timeout=PROBE_TIMEOUT_SECONDS)

    # --- Image ---------------------------------------------------------------------------------------------------

    def prepare_image(self, target: Target, image: dict) -> dict:
        return only(self.prepare_images([(target, image)]))

    def prepare_images(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        """Nothing to pull: what the job will run, computed (image_step_calls: the engine does this step in the
        transaction that claims it). Whether Slurm knows the chosen nodes and still starts work there is asked by the
        submission step, right before it submits."""
        return [_prepared(target, image) for target, image in items]

    # --- Run -----------------------------------------------------------------------------------------------------

    def start_workload(self, target: Target, image: dict) -> dict:
        return only(self.start_workloads([(target, image)]))

    def start_workloads(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        """First the batch's nodes, side by side: a node Slurm does not know fails its runs, one it starts no work on
        (drained or down since the placement) is the inventory's at once and its work is placed again, unsubmitted.
        Then, under the batch's submission locks, one look at Slurm's job list finds the jobs earlier attempts
        submitted (unless the batch holds only first tries, which nothing can have submitted yet: `_first_tries`); the
        others are submitted node by node in the order of the devices the platform chose there, so that Slurm, which
        binds a node's lowest free GPU indexes to the job it starts first, mostly binds what the platform chose. Once
        Slurm cannot be reached, the batch's remaining submissions fail with that (retryable) error."""
        results: list[dict | Exception | None] = [None] * len(items)
        try:
            with self._api() as api:
                refused = _nodes_refusing(api, [target for target, _ in items])
                with _submission_locks(sorted({target.request_id for target, _ in items})):
                    jobs = [] if _first_tries([target for target, _ in items]) else api.jobs()
                    for position in sorted(range(len(items)), key=lambda position: _device_order(items[position][0])):
                        target, image = items[position]
                        results[position] = _started(api, jobs, target, image, refused(target))
        except StepError as unavailable:
            return [unavailable if result is None else result for result in results]
        return results

    def workload_ready(self, target: Target, started: dict) -> dict:
        return only(self.workloads_ready([(target, started)]))

    def workloads_ready(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        """RUNNING is ready. Slurm usually starts a job within a scheduling pass, so one attempt watches the batch's
        jobs closely for a short while before handing the wait back to the engine (whose every attempt costs a claim
        and a record in the database). It hands back as soon as some have started: those are recorded ready and
        their runs go on while the engine watches the others again at once, instead of all of them waiting for the
        slowest. Each job is asked for by the id start_workload recorded: Slurm's whole job list costs slurmrestd
        and slurmctld time in proportion to every job they know, on every check."""
        try:
            with self._api() as api:
                jobs = _watched(api, [started["job_id"] for _, started in items], _just_submitted(items))
                held = {
                    name for target, started in items if _held_by_node(jobs[started["job_id"]]) for name in target.nodes
                }
                out_of_service = _out_of_service(_node_or_none(api, name) for name in sorted(held))
        except StepError as unavailable:
            return [unavailable] * len(items)
        # Still waiting: soon again when others of the batch have moved on (Slurm is starting them now), else later.
        retry_after = POLL_SECONDS if all(map(_waits, jobs.values())) else WATCH_EVERY_SECONDS
        results = []
        for target, started in items:
            job = jobs[started["job_id"]]
            try:
                lost = _lost_or(target, out_of_service, job_id=job and job["job_id"]) if _held_by_node(job) else None
                if lost is not None:
                    raise lost
                results.append(self._ready(target, job, retry_after))
            except (StepError, StepPending, PlacementLost) as outcome:
                results.append(outcome)
        return results

    def _ready(self, target: Target, job: dict | None, retry_after: float) -> dict:
        if job is None:
            raise StepError("slurm_job_missing", f"Slurm has no job for request #{target.request_id}.", retryable=False)
        state = job.get("job_state")
        if state in WAITING_STATES:
            raise StepPending(
                f"Slurm keeps job {job['job_id']} {state.lower()}: {job.get('state_reason') or 'not scheduled yet'}.",
                retry_after=retry_after,
                reason=pending_reason(job),
            )
        if state != RUNNING:
            ended = workload_end(job)
            raise StepError(
                "slurm_job_ended", f"{ended.message} before it was ready.", retryable=False, details=ended.details
            )
        limit = job.get("time_limit")
        if _short(job, target):  # an extension approved while the job was being submitted
            try:
                with self._api() as api:
                    limit = _raise_time_limit(api, job["job_id"], target.term_hours * 60)["time_limit_minutes"]
            except StepError as refused:  # the job runs; the reconciler raises the limit on its next pass
                logger.warning("Slurm job %s keeps its time limit for now: %s", job["job_id"], refused.message)
        members = gang_members(target, job) if target.gang else None
        return {
            "ready": True,
            "job_id": job["job_id"],
            "time_limit_minutes": limit,
            "node": job.get("nodes"),
            "partition": job.get("partition"),
            "gres": job.get("tres_per_node"),
            # A gang's are its leader's (the run's allocation); each member's are in `members`.
            "bound_indexes": gpu_indexes(job.get("gres_detail"))
            if members is None
            else next(member["bound_indexes"] for member in members if member["node"] == target.node),
            "workload_started_at": started_at(job),
            "output": output_path(target, job["job_id"]),
            "access": {"attach": attach_command(job["job_id"])},
            **({"num_nodes": len(members), "members": members} if members else {}),
        }

    def stop_workload(self, target: Target) -> dict:
        """Cancel the allocation's live jobs; done once Slurm confirms none is left. Slurm out of reach is an outage
        (the teardown waits for it); Slurm refusing to cancel a job on the node is a finding about that node."""
        cancelled = []
        with self._api() as api:
            for job in _jobs_of(api.jobs(), target):
                if job.get("job_state") in WAITING_STATES | {RUNNING}:
                    try:
                        api.cancel_job(job["job_id"])
                    except SlurmNotFound:  # it ended meanwhile
                        continue
                    except SlurmApiError as error:
                        raise with_isolation(classified(error), target) from error
                    cancelled.append(job["job_id"])
        unreserved = _release_nodes(target) if reserved(target) else False
        return {"cancelled": cancelled, "stopped": True, **({"reservation_deleted": True} if unreserved else {})}

    # --- End -----------------------------------------------------------------------------------------------------

    def ended_workloads(self, targets: Iterable[Target]) -> dict[int, WorkloadEnd]:
        """One look at Slurm's job list for all of them; a job Slurm no longer knows has ended too."""
        with self._api() as api:
            jobs = api.jobs()
        ended = {}
        for target in targets:
            job = _latest_job(jobs, target)
            if job is None:
                ended[target.allocation_id] = WorkloadEnd(
                    state="MISSING",
                    failed=False,
                    message=f"Slurm no longer knows a job for request #{target.request_id}",
                    details={"backend": "slurm"},
                )
            elif job.get("job_state") not in WAITING_STATES | {RUNNING, ENDING}:
                ended[target.allocation_id] = workload_end(job)
        return ended

    def extend_workloads(self, targets: Iterable[Target]) -> dict[int, dict]:
        """Raise the time limit of each target's live job to its request's term, in minutes, where it is shorter
        (one look at Slurm's job list for all of them). Over REST first; Slurm lets only operators and SlurmUser
        raise a limit, so when it refuses the token's user, through `scontrol update jobid=... TimeLimit=...` (the
        platform's host is a login node of the cluster, as for draining nodes)."""
        targets = list(targets)
        if not targets:
            return {}
        moved = {}
        with self._api() as api:
            jobs = api.jobs()
            for target in targets:
                job = _live_job(jobs, target)
                if job is not None and _short(job, target):
                    moved[target.allocation_id] = _raise_time_limit(api, job["job_id"], target.term_hours * 60) | {
                        "was_minutes": job["time_limit"]
                    }
        return moved

    def stop_orphans(self, still_held: Callable[[set[int]], set[int]]) -> list[dict]:
        with self._api() as api:
            live = [
                (job, JOB_COMMENT.match(job.get("comment") or ""))
                for job in api.jobs()
                if job.get("job_state") in WAITING_STATES | {RUNNING}
            ]
            ours = [(job, int(named["request"]), int(named["allocation"])) for job, named in live if named]
            held = still_held({allocation_id for _, _, allocation_id in ours})
            stopped = []
            for job, request_id, allocation_id in ours:
                if allocation_id in held:
                    continue
                try:
                    api.cancel_job(job["job_id"])
                except SlurmNotFound:  # it ended meanwhile
                    continue
                stopped.append(
                    {"request_id": request_id, "allocation_id": allocation_id, "workload": f"slurm job {job['job_id']}"}
                )
        return stopped


# --- The job ---------------------------------------------------------------------------------------------------


def image_command(image: dict) -> str:
    return (image.get("configuration") or {}).get("command") or ""


def batch_script(target: Target, image: dict) -> str:
    """The script Slurm runs on the node: it names what runs, then runs the image's command or holds the
    allocation for attaching. Catalog text is never written into it bare: the image's name and reference are
    quoted words of a no-op (a newline in a reference stays inside its quotes) and the greeting reads them from the
    job's environment; the image's command is what an operator configured to run."""
    label = f"{image['name']}:{image['version']}"
    return "\n".join(
        [
            "#!/bin/sh",
            f"# compute-catalog request {int(target.request_id)}",
            f": image {shlex.quote(label)} reference {shlex.quote(image['reference'])}",
            'echo "request $CC_REQUEST_ID ($CC_IMAGE) on $(hostname): Slurm job $SLURM_JOB_ID,'
            ' GPUs ${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-none}}"',
            image_command(image) or HOLD_COMMAND,
            "",
        ]
    )


def job_properties(target: Target, image: dict) -> dict:
    if any(device["milli"] < 1000 for device in target.devices):
        raise StepError(
            "slurm_slices_unsupported",
            "Slurm binds whole GPUs here (no MPS or shard GRES is configured): a slice cannot run as a Slurm job.",
            retryable=False,
        )
    nodes, (cpus_per_node, memory_mib_per_node) = target.nodes, node_share(target)
    environment = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        **{str(key): str(value) for key, value in ((image.get("configuration") or {}).get("env") or {}).items()},
        "CC_REQUEST_ID": str(target.request_id),
        "CC_IMAGE": f"{image['name']}:{image['version']}",
        "CC_IMAGE_REFERENCE": image["reference"],
        # The job's output file, and what the job writes, are its user's alone (slurmstepd creates the output with
        # this umask; without it, 0644).
        "SLURM_UMASK": PRIVATE_UMASK,
    }
    job = {
        "name": job_name(target.request_id),
        "comment": job_comment(target),
        # A node count, never a range: slurmrestd v0.0.38 runs [N, N] on one node. The pinned node list makes the
        # members the platform chose (all under one switch when the gang's domain is a rack) the job's nodes.
        "nodes": str(len(nodes)),
        "nodelist": ",".join(nodes),
        "gres": gres(target),  # per node
        "tasks": len(nodes),
        "tasks_per_node": 1,
        # The order's CPUs and memory are the gang's: each node gets its share.
        "cpus_per_task": cpus_per_node,
        "memory_per_node": memory_mib_per_node,
        "time_limit": target.term_hours * 60,  # the approved duration, with any extension approved since
        "current_working_directory": settings.SLURM_JOB_DIRECTORY,
        "standard_output": output_path(target, "%j"),
        "environment": environment,
    }
    if settings.SLURM_PARTITION:
        job["partition"] = settings.SLURM_PARTITION
    if reserved(target):
        job["reservation"] = reservation_name(target.request_id)
    return job


def gres(target: Target) -> str:
    """gpu:<type>:<count>, the GRES type Slurm knows the devices' model by: the type SLURM_GPU_MODELS maps onto the
    model (its untyped "gpu" key asks for gpu:<count>), else the model's slug, as the Slurm inventory import names
    an unmapped type."""
    models = {(device["model_slug"], device["model"]) for device in target.devices}
    if len(models) != 1:
        raise StepError(
            "slurm_gres_ambiguous",
            f"The allocation's devices are not of one GPU model: {sorted(slug for slug, _ in models)}.",
            retryable=False,
        )
    slug, name = models.pop()
    profiles = {device["mig"]["profile"] for device in target.devices if device.get("mig")}
    if profiles:  # a MIG instance: Slurm's MIG GRES is typed by the profile (gres.conf AutoDetect=nvml)
        return f"gpu:{sorted(profiles)[0]}:{len(target.devices)}"
    gpu_type = next(
        (gres_type for gres_type, model in settings.SLURM_GPU_MODELS.items() if model in (slug, name)), slug
    )
    count = len(target.devices)
    return f"gpu:{count}" if gpu_type == UNTYPED_GPU else f"gpu:{gpu_type}:{count}"


def output_path(target: Target, job_id) -> str:
    return f"{settings.SLURM_JOB_DIRECTORY.rstrip('/')}/{job_name(target.request_id)}-{job_id}.out"


def pending_reason(job: dict) -> dict | None:
    """Slurm's reason for keeping the job pending, as a platform reason ({code, message, details}) that keeps
    Slurm's own word and text; None while Slurm has not looked at the job yet."""
    slurm_reason = job.get("state_reason") or "None"
    if slurm_reason == "None":
        return None
    code = PENDING_REASONS.get(slurm_reason, BACKEND_HOLD)
    text = job.get("state_description") or slurm_reason
    return {
        "code": code,
        "message": f"Slurm keeps job {job['job_id']} pending on {job.get('nodes') or job.get('required_nodes')}: "
        f"{text}.",
        "details": {"backend": "slurm", "job_id": job["job_id"], "slurm_reason": slurm_reason},
    }


def workload_end(job: dict) -> WorkloadEnd:
    state = job.get("job_state") or "UNKNOWN"
    exit_code, signal = exit_status(job)
    reason = job.get("state_reason") or "None"
    how = ENDED_WELL.get(state) or ENDED_BADLY.get(state) or f"ended {state}"
    parts = [f"exit code {exit_code}" if exit_code is not None else None, f"signal {signal}" if signal else None]
    parts.append(f"Slurm's reason: {reason}" if reason != "None" else None)
    said = ", ".join(part for part in parts if part)
    return WorkloadEnd(
        state=state,
        failed=state not in ENDED_WELL,
        message=f"Slurm job {job['job_id']} {how}" + (f" ({said})" if said else ""),
        details={
            "backend": "slurm",
            "job_id": job["job_id"],
            "job_state": state,
            "exit_code": exit_code,
            "signal": signal,
            "slurm_reason": reason,
        },
    )


def _short(job: dict, target: Target) -> bool:
    """The job's time limit (minutes; Slurm's INFINITE/NO_VAL are not ints below 2**31) ends before the term."""
    limit = job.get("time_limit")
    return isinstance(limit, int) and limit < target.term_hours * 60


def _raise_time_limit(api: SlurmApi, job_id: int, minutes: int) -> dict:
    """{job_id, time_limit_minutes, via}: over REST, else (the token's user may not raise limits) with scontrol."""
    try:
        api.update_job(job_id, {"time_limit": minutes})
        via = "slurmrestd"
    except SlurmAccessDenied:
        try:
            scontrol.job_time_limit(job_id, minutes)
        except scontrol.ScontrolUnreachable as error:
            raise scontrol_outage(error) from error
        except scontrol.ScontrolError as error:
            raise StepError(
                "slurm_time_limit_refused",
                f"Slurm refused to raise job {job_id}'s time limit to {minutes} minutes over REST (the token's user "
                f"is no operator) and scontrol failed: {error}",
                retryable=True,
            ) from error
        via = "scontrol"
    return {"workload": f"Slurm job {job_id}", "job_id": job_id, "time_limit_minutes": minutes, "via": via}


def _jobs_of(jobs: list[dict], target: Target) -> list[dict]:
    name, comment = job_name(target.request_id), job_comment(target)
    return [job for job in jobs if job.get("name") == name and job.get("comment") == comment]


def _latest_job(jobs: list[dict], target: Target) -> dict | None:
    return max(_jobs_of(jobs, target), key=lambda job: job["job_id"], default=None)


def _live_job(jobs: list[dict], target: Target) -> dict | None:
    """The job an earlier attempt submitted for this allocation and Slurm still runs or holds."""
    live = [job for job in _jobs_of(jobs, target) if job.get("job_state") in WAITING_STATES | {RUNNING}]
    return max(live, key=lambda job: job["job_id"], default=None)


def _job_or_none(api: SlurmApi, job_id: int) -> dict | None:
    try:
        return api.job(job_id)
    except SlurmNotFound:
        return None


def _node_or_none(api: SlurmApi, name: str) -> dict | None:
    try:
        return api.node(name)
    except SlurmNotFound:
        return None


def _out_of_service(slurm_nodes: Iterable[dict | None]) -> dict[str, dict]:
    """The nodes (Slurm's objects, by name) Slurm starts no work on, their state written to the inventory now: a
    cordon with Slurm's reason, so the scheduler does not place there again before the minute's refresh."""
    unavailable = {node["name"]: node for node in slurm_nodes if node and SlurmNodeState.of(node).unavailable}
    if unavailable:
        slurm_node_states_apply(slurm_nodes=list(unavailable.values()))
    return unavailable


def _lost_or(target: Target, out_of_service: dict[str, dict], job_id: int | None = None) -> PlacementLost | None:
    """The work's placement lost when one of its nodes (any member of a gang: the whole gang goes back) is out of
    service; None when all are in service."""
    name = next((name for name in target.nodes if name in out_of_service), None)
    return None if name is None else _placement_lost(target, out_of_service[name], job_id=job_id)


def _placement_lost(target: Target, node: dict, job_id: int | None = None) -> PlacementLost:
    state = SlurmNodeState.of(node)
    held = f" (its job {job_id} was still pending)" if job_id else ""
    whole = f" The whole gang of {len(target.gang)} nodes is placed again." if target.gang else ""
    return PlacementLost(
        {
            "code": NODE_UNAVAILABLE,
            "message": f"Slurm has node {node['name']} {state.label} ({state.reason or 'no reason given'}) and starts "
            f"no work there{held}.{whole}",
            "details": {
                "backend": "slurm",
                "node": node["name"],
                "slurm_state": state.label,
                "slurm_reason": state.reason,
                "job_id": job_id,
            },
        }
    )


def _held_by_node(job: dict | None) -> bool:
    """Slurm keeps the job pending for a reason about its node (which may be out of service)."""
    return _waits(job) and job.get("state_reason") in NODE_PENDING_REASONS


def _prepared(target: Target, image: dict) -> dict:
    return {
        "image": f"{image['name']}:{image['version']}",
        "reference": image["reference"],
        "runs": "the image's command" if image_command(image) else "an interactive allocation (no command)",
        "script_sha256": hashlib.sha256(batch_script(target, image).encode()).hexdigest(),
    }


def _nodes_refusing(api: SlurmApi, targets: list[Target]) -> Callable[[Target], StepError | PlacementLost | None]:
    """The targets' nodes asked for side by side (the batch's first submission waits for the last answer): for a
    target, why Slurm will not start its work (a node it does not know, or one out of service), or None."""
    nodes = _side_by_side(api, _node_or_none, sorted({name for target in targets for name in target.nodes}))
    out_of_service = _out_of_service(nodes.values())

    def refusal(target: Target) -> StepError | PlacementLost | None:
        unknown = [name for name in target.nodes if nodes[name] is None]
        if unknown:
            return StepError(
                "slurm_node_unknown",
                f"Slurm has no node {unknown[0]!r}; the inventory and the cluster disagree.",
                retryable=False,
                details={"isolate": True, "node": unknown[0]},
            )
        return _lost_or(target, out_of_service)

    return refusal


def _device_order(target: Target) -> tuple[str, int]:
    return target.node, min((device["index"] for device in target.devices), default=-1)


def _started(
    api: SlurmApi, jobs: list[dict], target: Target, image: dict, refusal: StepError | PlacementLost | None
) -> dict | StepError | PlacementLost:
    """The live job of an earlier attempt, else a new submission (as Slurm holds it then: PENDING; one Slurm
    accepted with an error, 2068 while its node registers after a restart, is that job, the error kept as a warning),
    unless its node refused the work when asked just before (`refusal`). A refusal is this run's outcome; Slurm out of
    reach is the batch's (raised), and the next attempt looks the job up by its name and comment before submitting
    again (a submission that timed out may have been accepted). A node that went out of service since it was asked
    and is named by the submission's answer: its work is placed again."""
    job = _live_job(jobs, target)
    if job is None and refusal is not None:  # nothing submitted yet, and its node would not take it
        return refusal
    if job is None:
        try:
            _reserve_nodes(target)
            answer = api.submit_job(batch_script(target, image), job_properties(target, image))
            job = {"job_id": answer["job_id"], "job_state": "PENDING", "warnings": answer.get("warnings", [])}
        except StepError as refused:
            return refused
        except SlurmApiError as error:
            refused = _out_of_service_of(api, target) if _node_refused(error.errors) else {}
            lost = _lost_or(target, refused)
            if lost is not None:
                return lost
            if error.retryable:
                raise
            return classified(error)
        # Accepted, but its node not available: out of service (drained since it was asked: placed again, the
        # teardown cancels the job), or registering after a restart (the job is kept; it starts once it has).
        refused = _out_of_service_of(api, target) if _node_refused(job["warnings"]) else {}
        lost = _lost_or(target, refused, job_id=job["job_id"])
        if lost is not None:
            return lost
        submitted = True
    else:
        submitted = False
    return {
        "workload": f"slurm job {job['job_id']}",
        "job_id": job["job_id"],
        "submitted": submitted,
        "host": target.node,
        **({"nodes": target.nodes} if target.gang else {}),
        "ports": {},
        "job_state": job.get("job_state"),
        "output": output_path(target, job["job_id"]),
        **({"slurm_warnings": job["warnings"]} if job.get("warnings") else {}),
    }


def _reserve_nodes(target: Target) -> None:
    """An advance reservation's whole nodes reserved in Slurm for its term, for the REST user (whose jobs the
    platform submits); an earlier attempt's reservation is kept."""
    if not reserved(target):
        return
    try:
        scontrol.create_reservation(
            reservation_name(target.request_id),
            users=settings.SLURM_USER_NAME,
            nodes=target.nodes,
            minutes=target.term_hours * 60,
        )
    except scontrol.ScontrolUnreachable as error:
        raise scontrol_outage(error) from error
    except scontrol.ScontrolError as error:
        if "Duplicate" not in str(error):
            raise StepError("slurm_reservation_refused", f"Slurm did not make the reservation: {error}") from error


def _release_nodes(target: Target) -> bool:
    """The advance reservation's Slurm reservation deleted (True), or none was there (False)."""
    try:
        scontrol.delete_reservation(reservation_name(target.request_id))
    except scontrol.ScontrolUnreachable as error:
        raise scontrol_outage(error) from error
    except scontrol.ScontrolError as error:
        if "not found" in str(error).lower() or "invalid" in str(error).lower():
            return False
        raise StepError("slurm_reservation_not_deleted", f"Slurm did not delete the reservation: {error}") from error
    return True


def _out_of_service_of(api: SlurmApi, target: Target) -> dict[str, dict]:
    return _out_of_service([_node_or_none(api, name) for name in target.nodes])


def gang_members(target: Target, job: dict) -> list[dict]:
    """A gang's job as its record shows it: every member node with the GPU indexes Slurm bound there (gres_detail has
    one entry per node, in the order of the job's nodes). RUNNING on fewer nodes than the gang has is never ready: a
    half-running gang is refused (its run fails and the job is cancelled)."""
    names, details = expand_hostlist(job.get("nodes") or ""), job.get("gres_detail") or []
    if job.get("node_count") != len(target.gang) or len(names) != len(target.gang):
        raise StepError(
            "slurm_gang_partial",
            f"Slurm runs job {job['job_id']} on {job.get('node_count')} nodes ({job.get('nodes')}); the gang has "
            f"{len(target.gang)} ({', '.join(target.nodes)}).",
            retryable=False,
            details={"job_id": job["job_id"], "nodes": names, "gang": target.nodes},
        )
    allocations = {member["node"]: member["allocation_id"] for member in target.gang}
    return [
        {
            "node": name,
            "allocation_id": allocations.get(name),
            "bound_indexes": gpu_indexes(details[position : position + 1]),
        }
        for position, name in enumerate(names)
    ]


def _just_submitted(items: list[tuple[Target, dict]]) -> dict[int, dict] | None:
    """The batch's jobs as their submissions left them moments ago (pending), when this is the first readiness check
    of runs that all submitted their job: nothing to ask Slurm before the first turn of the watch. None otherwise (a
    later check, or a job an earlier attempt had submitted: it may have started long ago)."""
    if not all(target.attempt == 1 and started.get("submitted") for target, started in items):
        return None
    return {started["job_id"]: {"job_id": started["job_id"], "job_state": started["job_state"]} for _, started in items}


def _watched(api: SlurmApi, job_ids: list[int], known: dict[int, dict] | None = None) -> dict[int, dict | None]:
    """The jobs (None for one Slurm does not know): all of them at once (unless `known` says how they were just now),
    then, while every one still waits, one of them each WATCH_EVERY_SECONDS, in turn, up to WATCH_SECONDS; once that
    one has started (or ended, or is unknown), all of them again, and the batch's news goes back at once. Right after
    the submissions the first look is skipped: every batch asking for all of its jobs then would load slurmctld with
    a hundred answers all saying pending while it still takes the other batches' submissions.

    Slurm starts a wave of jobs in a few scheduling passes, so while the one asked for waits the others almost always
    do too: asking for a batch's jobs ten times a second would keep slurmrestd busy on the very CPU that slurmctld needs
    to start them. The whole batch is asked for side by side (`_side_by_side`): while slurmctld starts a wave it
    answers a job query far more slowly than before, and asked one after another a batch saw jobs that were already
    running only long after they had started."""
    jobs = dict(known) if known else _side_by_side(api, _job_or_none, job_ids)
    deadline = time.monotonic() + WATCH_SECONDS
    for job_id in itertools.cycle(job_ids):
        if not all(map(_waits, jobs.values())) or time.monotonic() >= deadline:
            break
        time.sleep(WATCH_EVERY_SECONDS)
        jobs[job_id] = _job_or_none(api, job_id)
        if not _waits(jobs[job_id]):
            jobs = _side_by_side(api, _job_or_none, job_ids)
    return jobs


def _side_by_side(api: SlurmApi, ask: Callable[[SlurmApi, object], dict | None], keys: list) -> dict:
    """ask(api, key) of every key, SLURM_WATCH_CONCURRENCY at once (each is a round trip through slurmrestd to
    slurmctld), by key."""
    return dict(zip(keys, in_lanes(lambda key: ask(api, key), keys, settings.SLURM_WATCH_CONCURRENCY), strict=True))


def _node_refused(errors: list[dict]) -> bool:
    """Slurm's answer names the node not available (ESLURM_NODE_NOT_AVAIL, 2068)."""
    return any(error_number(entry) == NODE_NOT_AVAILABLE_ERRNO for entry in errors)


def _waits(job: dict | None) -> bool:
    return job is not None and job.get("job_state") in WAITING_STATES


def classified(error: SlurmApiError) -> StepError:
    """Slurm's answer as the step's outcome: an outage of the whole backend (slurmrestd or slurmctld out of reach,
    waited out), or a refusal that fails the step at once with Slurm's errors (an unknown partition, an invalid
    request, access denied)."""
    details = {"errors": error.errors}
    if isinstance(error, SlurmUnavailable):
        return BackendUnavailable(
            "slurm_unavailable",
            str(error),
            backend="slurm",
            waiting_for=error.part,
            whole_backend=True,
            details=details,
        )
    return StepError("slurm_refused", str(error), retryable=False, details=details)


def with_isolation(error: StepError, target: Target) -> StepError:
    """A refusal to stop the node's work is a finding about that node (it keeps the job); an outage is not."""
    if isinstance(error, BackendUnavailable):
        return error
    return with_details(error, isolate=True, node=target.node)


def _first_tries(targets: list[Target]) -> bool:
    """Every target is the first attempt of its run's start step: then no worker can have submitted its job yet, and
    the job list (slurmrestd's dearest answer: it grows with every job slurmctld knows) is not read. A job is the
    allocation's (its comment), an allocation has one provisioning run (an operator's retry binds a new one), a worker
    submits only after claiming the run's start step and every claim counts an attempt: read under the submission
    locks, attempts still 1 proves it. A worker that took the step over from a stalled one counted a second attempt
    before it could submit, and either it holds the locks already (this batch then reads 2 and lists) or it waits for
    them and lists after this batch's submissions. No row (a call from outside a run) proves nothing."""
    if any(target.attempt != 1 for target in targets):
        return False
    run_ids = {target.run_id for target in targets}
    return ProvisioningStep.objects.filter(run_id__in=run_ids, name=START_STEP, attempts=1).count() == len(run_ids)


@contextmanager
def _submission_locks(request_ids: list[int]):
    """Held from the look-up to the submissions, so that of two workers the second finds the first one's jobs
    (taken in request order, so two batches sharing requests cannot deadlock)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # one statement: unnest gives the (sorted) ids in their order
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, id) FROM unnest(%s::int[]) AS id",
                    [SUBMIT_LOCK_NAMESPACE, request_ids],
                )
        yield
