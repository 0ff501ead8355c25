"""What each pipeline step does. A handler takes the step's context, makes its driver calls (idempotent: a step
whose worker died runs again) and returns the step's output; it raises StepError or StepPending otherwise."""

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from catalog.choices import TENANT_ROOT_MEMBERSHIPS, BootMethod
from config.errors import Conflict
from provisioning import netboot
from provisioning.choices import RunKind, StepState
from provisioning.connect import connect_secret_issue, connect_secrets_forget
from provisioning.drivers import bmc_driver, in_band_driver, serving_driver, workload_driver
from provisioning.drivers.base import (
    ACCELERATOR_TYPES,
    StepError,
    StepPending,
    Target,
    only,
    outcome_of,
    slurm_membership,
    with_details,
)
from provisioning.drivers.keys import requester_keys
from provisioning.installer_tokens import installer_token_issue
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.targets import allocation_target
from requests.choices import EventCode
from requests.services import record_event
from scheduling.allocations import allocations_adopt_backend_bindings, allocations_workload_started
from scheduling.choices import AllocationState, ExecutionBackend
from scheduling.models import Allocation
from serving.deployments import (
    deployment_for,
    deployment_serve,
    deployment_stop,
    endpoint_url,
    example_curl,
    probe,
    replica_devices,
    replicas_not_ready,
)
from serving.models import ServingReplica
from serving.routes import routes_changed

POWER_POLL_SECONDS = 2.0
INSTALLER_POLL_SECONDS = 60.0
BASIC_HARDWARE_CHECKS = ["bmc_reachable", "system_health", "inventory_match"]


class StepOutputs:
    """The outputs of the succeeded steps of a batch of runs, by run and step name, read for all of them at the
    first use (the first of a name wins, as a run carried over from a retry may repeat one)."""

    def __init__(self, run_ids: list[int]):
        self.run_ids = run_ids
        self._by_run: dict[int, dict[str, dict]] | None = None

    def of_run(self, run_id: int) -> dict[str, dict]:
        if self._by_run is None:
            self._by_run = defaultdict(dict)
            succeeded = ProvisioningStep.objects.filter(run_id__in=self.run_ids, state=StepState.SUCCEEDED)
            for step_run, name, output in succeeded.order_by("-position").values_list("run_id", "name", "output"):
                self._by_run[step_run][name] = output
        return self._by_run[run_id]


@dataclass
class StepContext:
    run: ProvisioningRun
    step: ProvisioningStep
    target: Target
    batch_outputs: StepOutputs | None = None  # shared by the contexts of one batch; else this run's own

    def __post_init__(self):
        if self.batch_outputs is None:
            self.batch_outputs = StepOutputs([self.run.pk])

    @cached_property
    def bmc(self):
        return bmc_driver(self.run.driver)

    @cached_property
    def workload(self):
        return workload_driver(self.target.backend)

    @cached_property
    def in_band(self):
        # A playbook gets the step's timeout, but no more than the worker's task may run (it would be killed).
        return in_band_driver(timeout=min(self.step.timeout_seconds, settings.Q_CLUSTER["timeout"] - 30))

    @cached_property
    def inference(self):
        return serving_driver((self.snapshot.get("serving") or {}).get("runtime", "simulated"))

    @property
    def snapshot(self) -> dict:
        return self.target.snapshot

    def close(self) -> None:
        if "bmc" in self.__dict__:  # only when a step used it
            self.bmc.close()

    @property
    def outputs(self) -> dict[str, dict]:
        """The outputs of the run's succeeded steps by name."""
        return self.batch_outputs.of_run(self.run.pk)

    def output_of(self, name: str) -> dict:
        return self.outputs.get(name) or {}


def _one_of(batch: Callable[[list[StepContext]], list[dict | Exception]]) -> Callable[[StepContext], dict]:
    """A step's handler for one run, from its batch form."""

    def handler(ctx: StepContext) -> dict:
        return only(batch([ctx]))

    handler.__name__ = handler.__qualname__ = batch.__name__.removesuffix("s")
    return handler


# --- compute -----------------------------------------------------------------------------------------------


def prepare_images(contexts: list[StepContext]) -> list[dict | Exception]:
    return contexts[0].workload.prepare_images([(ctx.target, ctx.snapshot["image"]) for ctx in contexts])


def start_workloads(contexts: list[StepContext]) -> list[dict | Exception]:
    started = contexts[0].workload.start_workloads([(ctx.target, ctx.snapshot["image"]) for ctx in contexts])
    return [_with_connect_secrets(ctx, result) for ctx, result in zip(contexts, started, strict=True)]


def _with_connect_secrets(ctx: StepContext, started: dict | Exception) -> dict | Exception:
    """The started workload's secrets (a workspace's Jupyter token) issued for its requester and installed in it; the
    output names them, never their values (provisioning/connect.py). A failure is this run's outcome only."""
    if isinstance(started, Exception):
        return started
    return outcome_of(_install_connect_secrets, ctx, started)


def _install_connect_secrets(ctx: StepContext, started: dict) -> dict:
    names = ctx.workload.connect_secret_names(ctx.target)
    for name in names:
        ctx.workload.connect_secret_set(ctx.target, name, connect_secret_issue(run=ctx.run, name=name))
    return {**started, "connect_secrets": list(names)} if names else started


def readiness_checks(contexts: list[StepContext]) -> list[dict | Exception]:
    """Ready when the backend says so. Why the backend still holds a workload back goes on its request; the devices
    it actually bound (Slurm picks the GPU indexes inside the node) become the allocation's."""
    backend = contexts[0].target.backend
    results = contexts[0].workload.workloads_ready([(ctx.target, ctx.output_of("start_workload")) for ctx in contexts])
    bound = {
        ctx.run.allocation_id: result["bound_indexes"]
        for ctx, result in zip(contexts, results, strict=True)
        if isinstance(result, dict) and "bound_indexes" in result
    }
    # A gang's other members: the indexes the backend bound on each member's node (Slurm) become that member's; a
    # backend that binds what the platform chose (containers) reports none.
    bound |= {
        member["allocation_id"]: member["bound_indexes"]
        for result in results
        if isinstance(result, dict)
        for member in result.get("members", ())
        if "bound_indexes" in member and member["allocation_id"] not in bound
    }
    bindings = allocations_adopt_backend_bindings(bound=bound, backend=backend) if bound else {}
    outcomes = [_readiness(ctx, result, bindings) for ctx, result in zip(contexts, results, strict=True)]
    allocations_workload_started(
        started={
            ctx.run.allocation_id: _workload_started_at(outcome)
            for ctx, outcome in zip(contexts, outcomes, strict=True)
            if isinstance(outcome, dict)
        },
        slurm_jobs={
            ctx.run.allocation_id: outcome["job_id"]
            for ctx, outcome in zip(contexts, outcomes, strict=True)
            if backend == ExecutionBackend.SLURM and isinstance(outcome, dict) and "job_id" in outcome
        },
    )
    return outcomes


def _workload_started_at(ready: dict) -> datetime:
    """When the backend says it started the workload (a Slurm job's start time), else now: it runs from here on."""
    reported = ready.get("workload_started_at")
    return datetime.fromisoformat(reported) if reported else timezone.now()


def _readiness(ctx: StepContext, result: dict | Exception, bindings: dict[int, dict | Conflict]) -> dict | Exception:
    if isinstance(result, StepPending) and result.reason:
        _note_backend_wait(ctx, result.reason)
    if isinstance(result, Exception) or "bound_indexes" not in result:
        return result
    binding = bindings[ctx.run.allocation_id]
    if isinstance(binding, Conflict):
        return StepError(binding.code, binding.message, retryable=False, details=binding.details)
    return {**result, "binding": binding}


prepare_image = _one_of(prepare_images)
start_workload = _one_of(start_workloads)
readiness_check = _one_of(readiness_checks)


def _note_backend_wait(ctx: StepContext, reason: dict) -> None:
    """One timeline note per change of the backend's reason (a poll repeats itself)."""
    last = ctx.run.request.events.filter(code=EventCode.QUEUE_REASON).order_by("-created_at", "-id").first()
    if last is None or last.data.get("details") != reason["details"] or last.data.get("code") != reason["code"]:
        record_event(
            request=ctx.run.request, actor=None, code=EventCode.QUEUE_REASON, message=reason["message"], data=reason
        )


def _delivered_base(ctx: StepContext) -> dict:
    allocation = ctx.run.allocation
    return {
        "node": ctx.target.node,
        "devices": list(ctx.target.devices),
        "started_at": allocation.started_at.isoformat(),
        "expires_at": allocation.expires_at.isoformat(),
    }


def publish_compute_access(ctx: StepContext) -> dict:
    """Where it runs and how to reach it: the backend's own access (a Slurm job: attach with srun) or the
    workspace's SSH and notebook ports."""
    workload, ready = ctx.output_of("start_workload"), ctx.output_of("readiness_check")
    host, ports = workload["host"], workload["ports"]
    user = workload.get("user") or ctx.run.request.requester.username  # a backend may name the account it made
    image = ctx.snapshot["image"]
    # num_nodes, members and rendezvous: a gang's (its member nodes; where its containers meet).
    facts = ("job_id", "partition", "gres", "output", "time_limit_minutes", "num_nodes", "members", "rendezvous")
    backend_facts = {key: ready[key] for key in facts if key in ready}
    digest = ctx.output_of("prepare_image").get("digest")
    return {
        **_delivered_base(ctx),
        "host": host,
        "ports": ports,
        "workload": workload["workload"],
        "image": f"{image['name']}:{image['version']}",
        **({"image_digest": digest} if digest else {}),
        "backend": ctx.target.backend,
        **backend_facts,
        "user": user,  # the account to connect as (the CLI's ssh, the IDE links)
        "access": ready.get("access") or _workspace_access(workload, host, ports, user),
        # Access entries opened with a secret only the requester is shown (provisioning/connect.py).
        **({"connect_secrets": workload["connect_secrets"]} if workload.get("connect_secrets") else {}),
    }


def _workspace_access(workload: dict, host: str, ports: dict, user: str) -> dict:
    access = {"ssh": f"ssh -p {ports['ssh']} {user}@{host}"}
    if "jupyter" in ports:
        access["jupyter"] = f"https://{host}:{ports['jupyter']}/"
    return {**access, **workload.get("access", {})}  # what the backend knows better (Jupyter's URL)


def stop_workload(ctx: StepContext) -> dict:
    _wait_for_inflight_provisioning(ctx)
    stopped = ctx.workload.stop_workload(ctx.target)
    connect_secrets_forget(allocation_id=ctx.target.allocation_id)  # nothing left for them to open
    return stopped


# --- bare metal --------------------------------------------------------------------------------------------


def validate_hardware(ctx: StepContext) -> dict:
    try:
        found = ctx.bmc.inventory(ctx.target)
    except StepError as unreachable:  # bmc_reachable is a check like the others: its final failure isolates
        raise with_details(unreachable, isolate=True) from unreachable
    checks = [
        check
        for check in ctx.snapshot["bare_metal_profile"]["validation_suite"] or BASIC_HARDWARE_CHECKS
        if check in BASIC_HARDWARE_CHECKS
    ]
    results = {"bmc_reachable": "passed"}
    if "system_health" in checks:
        results["system_health"] = _system_health(found)
    if "inventory_match" in checks:
        results["inventory_match"] = _inventory_match(ctx.target.inventory, found)
    return {"inventory": found, "checks": results}


def _system_health(found: dict) -> str:
    if found["health"] not in ("OK", None):
        raise _isolating_error("hardware_unhealthy", f"The BMC reports system health {found['health']}.", found)
    # A system can still read OK while one of its GPUs is Critical (only the rollup says so): judge each processor.
    processors = found.get("processors")
    unhealthy = [p for p in processors or [] if p["health"] not in ("OK", None)]
    if unhealthy:
        accelerators = [p for p in processors if p["type"] in ACCELERATOR_TYPES]
        failing_accelerators = [p for p in unhealthy if p["type"] in ACCELERATOR_TYPES]
        described = ", ".join(
            f"{p['id']} ({p['type']} {p['model'] or 'unknown model'}, serial {p['serial'] or 'unknown'}) {p['health']}"
            for p in unhealthy
        )
        raise _isolating_error(
            "processor_unhealthy",
            f"The BMC reports {len(failing_accelerators)} of {len(accelerators)} accelerators and "
            f"{len(unhealthy) - len(failing_accelerators)} CPUs unhealthy: {described}.",
            {
                "unhealthy": unhealthy,
                "accelerators": len(accelerators),
                "accelerators_unhealthy": len(failing_accelerators),
            },
        )
    if found["health"] is None:
        return "not reported"
    return "passed" if processors is not None else "passed (processors not reported by the BMC)"


def _inventory_match(expected: dict, found: dict) -> str:
    mismatches = {
        key: {"inventory": expected[key], "bmc": found[key]}
        for key in ("cpu_cores", "memory_gb", "accelerators")
        if found.get(key) is not None and found[key] != expected.get(key)
    }
    serials, serial_note = _serial_mismatch(expected.get("accelerator_serials", []), found.get("processors"))
    if serials:
        mismatches["accelerator_serials"] = serials
    if mismatches:
        raise _isolating_error(
            "inventory_mismatch",
            f"The server does not match the inventory: {_described(mismatches)}.",
            {"mismatches": mismatches},
        )
    unreported = [key for key in ("cpu_cores", "memory_gb", "accelerators") if found.get(key) is None]
    notes = [f"{', '.join(unreported)} not reported by the BMC"] if unreported else []
    return "passed" + (f" ({'; '.join([*notes, serial_note])})" if notes or serial_note else "")


def _serial_mismatch(recorded: list[dict], processors: list[dict] | None) -> tuple[dict, str]:
    """The accelerator serials the inventory records but the BMC does not report (a card swapped or gone), and,
    when every device has a serial recorded, those the BMC reports that the inventory does not know. ({}, note)
    when there is nothing to compare or everything matches."""
    reported = {p["serial"] for p in processors or [] if p["type"] in ACCELERATOR_TYPES and p["serial"]}
    known = {device["serial"]: device["index"] for device in recorded if device["serial"]}
    if not known:  # the inventory claims no serials: nothing to hold the BMC to
        return {}, ""
    if not reported:
        return {}, "accelerator serials not reported by the BMC"
    missing = [{"index": index, "serial": serial} for serial, index in known.items() if serial not in reported]
    fully_recorded = len(known) == len(recorded)
    unexpected = sorted(reported - set(known)) if fully_recorded else []
    if not missing and not unexpected:
        return {}, "" if fully_recorded else f"serials of {len(recorded) - len(known)} devices not recorded"
    return {"missing_at_bmc": missing, "unknown_to_inventory": unexpected}, ""


def _described(mismatches: dict) -> str:
    parts = [
        f"{key} {values['bmc']} (inventory says {values['inventory']})"
        for key, values in mismatches.items()
        if key != "accelerator_serials"
    ]
    serials = mismatches.get("accelerator_serials", {"missing_at_bmc": [], "unknown_to_inventory": []})
    parts += [f"gpu{gone['index']} serial {gone['serial']} not at the BMC" for gone in serials["missing_at_bmc"]]
    parts += [f"serial {serial} not in the inventory" for serial in serials["unknown_to_inventory"]]
    return ", ".join(parts)


def _isolating_error(code: str, message: str, details: dict) -> StepError:
    """A hardware finding: retrying will not fix it, and the node must not take new work until someone looks."""
    return StepError(code, message, retryable=False, details={**details, "isolate": True})


def boot_installer(ctx: StepContext) -> dict:
    profile = ctx.snapshot["bare_metal_profile"]
    image = profile["os_image_url"]
    if not image.startswith(("http://", "https://")):
        raise StepError(
            "installer_image_not_bootable",
            f"The OS image {image!r} is not an http(s) URL that virtual media or the installer can fetch.",
            retryable=False,
        )
    if profile.get("boot_method") == BootMethod.PXE:
        return _boot_from_network(ctx, installer_token_issue)
    token = installer_token_issue(run=ctx.run)
    separator = "&" if "?" in image else "?"
    # The BMC hands the image URL to the installer: its query (callback and token) is for the installer only, and
    # the drivers keep it out of their summaries and logs.
    query = urlencode({"callback": netboot.callback_url(), "token": token})
    media = ctx.bmc.insert_media(ctx.target, f"{image}{separator}{query}")
    boot = ctx.bmc.set_one_time_boot(ctx.target, "Cd")
    return {"image": image, "media": media.get("media"), "boot": boot}


def _boot_from_network(ctx: StepContext, token_issue: Callable[..., str]) -> dict:
    """PXE: the site's DHCP / iPXE chain hands the server the platform's one script URL, and the platform answers it,
    recognised by its address, with this run's script and install config (docs/provisioning.md, PXE). So the node's
    address must be known, and the output holds no secret: the token is only in the install config."""
    netboot_files = ctx.snapshot["bare_metal_profile"].get("netboot") or {}
    if not all(netboot_files.get(key) for key in ("kernel", "initrd")):
        raise StepError(
            "netboot_not_configured",
            "The OS image names no netboot kernel and initrd, which a PXE boot loads.",
            retryable=False,
        )
    if not ctx.target.os_address:
        raise StepError(
            "node_address_unknown",
            f"A PXE boot hands the install files to the server by its address, and node {ctx.target.node} has no OS "
            "address recorded.",
            retryable=False,
        )
    addresses = netboot.node_addresses(ctx.target.os_address)
    if not addresses:  # a name the resolver does not know now: it may later (retried)
        raise StepError(
            "node_address_unresolved",
            f"The OS address {ctx.target.os_address!r} of node {ctx.target.node} does not resolve.",
        )
    token_issue(run=ctx.run)
    boot = ctx.bmc.set_one_time_boot(ctx.target, "Pxe")
    return {"boot_method": BootMethod.PXE, "script": netboot.script_url(), "served_to": sorted(addresses), "boot": boot}


def power_cycle(ctx: StepContext) -> dict:
    action = "On" if ctx.bmc.power_state(ctx.target) == "Off" else "ForceRestart"
    return ctx.bmc.power(ctx.target, action)


def _await_power(ctx: StepContext, wanted: str) -> dict:
    state = ctx.bmc.power_state(ctx.target)
    if state != wanted:
        raise StepPending(f"Power state is {state}; waiting for {wanted}.", retry_after=POWER_POLL_SECONDS)
    return {"power_state": state}


def wait_power_on(ctx: StepContext) -> dict:
    return _await_power(ctx, "On")


def wait_for_install(ctx: StepContext) -> dict:
    run = ProvisioningRun.objects.get(pk=ctx.run.pk)
    if run.installer_reported_at is None:
        raise StepPending("Waiting for the OS installer's completion callback.", retry_after=INSTALLER_POLL_SECONDS)
    report = run.installer_report
    if report.get("status") != "succeeded":
        raise StepError(
            "installer_failed",
            f"The OS installer reported failure: {report.get('detail') or 'no detail'}",
            retryable=False,
            details={"report": report},
        )
    return {"reported_at": run.installer_reported_at.isoformat(), "os": ctx.snapshot["bare_metal_profile"]["os_image"]}


def install_gpu_driver(ctx: StepContext) -> dict:
    return ctx.in_band.install_gpu_driver(ctx.target, ctx.snapshot["bare_metal_profile"]["driver_version"])


def install_monitoring_agent(ctx: StepContext) -> dict:
    profile = ctx.snapshot["bare_metal_profile"]
    # Snapshots approved before profiles named a GPU exporter have none.
    return ctx.in_band.install_monitoring_agent(
        ctx.target, profile["monitoring_agent"], profile.get("gpu_exporter", "")
    )


def register_cluster(ctx: StepContext) -> dict:
    return ctx.in_band.register_in_cluster(ctx.target, ctx.snapshot["bare_metal_profile"]["target_cluster"])


def grant_access(ctx: StepContext) -> dict:
    """The requester's account, accepting the order's key and the keys on their profile as a container workspace
    does (drivers.keys), with root only on a server that holds no secret shared with other tenants."""
    return ctx.in_band.grant_access(
        ctx.target,
        ssh_public_keys=requester_keys(ctx.target),
        root=slurm_membership(ctx.target) in TENANT_ROOT_MEMBERSHIPS,
    )


def post_install_health_check(ctx: StepContext) -> dict:
    checks = [
        check for check in ctx.snapshot["bare_metal_profile"]["validation_suite"] if check not in BASIC_HARDWARE_CHECKS
    ]
    try:
        return ctx.in_band.health_check(ctx.target, checks)
    except StepError as failure:
        raise _isolating_error(failure.code, failure.message, failure.details) from failure


IN_BAND_STEPS = ("install_gpu_driver", "install_monitoring_agent", "register_cluster", "grant_access", "health_check")


def publish_bare_metal_access(ctx: StepContext) -> dict:
    """The delivered server: where it answers, what the BMC found, the driver version the host reports, the agent's
    endpoint, its node name in the cluster, and each in-band step's playbook summary (the `ansible` driver's)."""
    profile = ctx.snapshot["bare_metal_profile"]
    registered, access = ctx.output_of("register_cluster"), ctx.output_of("grant_access")
    address = registered.get("address") or access.get("address") or ctx.target.node
    # Runs from before the access step had the requester's username as their account, and no root.
    user = access.get("user") or ctx.run.request.requester.username
    agent = ctx.output_of("install_monitoring_agent")
    in_band = {name: ctx.output_of(name) for name in IN_BAND_STEPS}
    summaries = {
        name: {key: value for key, value in output["ansible"].items() if key != "log"}
        for name, output in in_band.items()
        if "ansible" in output
    }
    return {
        **_delivered_base(ctx),
        "host": address,
        "os": profile["os_image"],
        "slurm_membership": slurm_membership(ctx.target),
        "cluster": registered.get("cluster", profile["target_cluster"]),
        **({"cluster_node": registered.get("node_name", ctx.target.node)} if registered.get("cluster") else {}),
        "root": bool(access.get("root")),
        "driver_version": ctx.output_of("install_gpu_driver").get("driver_version") or profile["driver_version"],
        "monitoring_agent": profile["monitoring_agent"],
        **({"agent_endpoint": agent["endpoint"]} if "endpoint" in agent else {}),
        **({"gpu_exporter_endpoint": agent["gpu_exporter_endpoint"]} if "gpu_exporter_endpoint" in agent else {}),
        "bmc_findings": ctx.output_of("validate_hardware").get("checks", {}),
        **({"in_band": summaries} if summaries else {}),
        "access": {"ssh": f"ssh {user}@{address}"},
    }


def deregister_cluster(ctx: StepContext) -> dict:
    _wait_for_inflight_provisioning(ctx)
    return ctx.in_band.deregister_from_cluster(ctx.target, ctx.snapshot["bare_metal_profile"]["target_cluster"])


def power_off(ctx: StepContext) -> dict:
    if ctx.bmc.power_state(ctx.target) == "Off":
        return {"power_state": "Off", "changed": False}
    return ctx.bmc.power(ctx.target, "ForceOff")


def wait_power_off(ctx: StepContext) -> dict:
    return _await_power(ctx, "Off")


def eject_media(ctx: StepContext) -> dict:
    return ctx.bmc.eject_media(ctx.target)


def mark_for_cleaning(ctx: StepContext) -> dict:
    return ctx.in_band.request_cleaning(ctx.target)


# --- both --------------------------------------------------------------------------------------------------


def return_capacity(ctx: StepContext) -> dict:
    """The last step of a release or cleanup: the devices go back to the scheduler, which finishes a release."""
    from scheduling.reclaim import allocation_free

    allocation_free(request_ids=[ctx.run.request_id], reason=ctx.run.reason or ctx.run.get_kind_display())
    return {"returned": [device["uuid"] for device in ctx.target.devices]}


def _wait_for_inflight_provisioning(ctx: StepContext) -> None:
    """Tearing down while a provisioning step is still running on another worker could leave what that step
    creates behind: wait until it has stopped (its worker sees the cancelled run) or its lease has expired."""
    inflight = (
        ProvisioningStep.objects.filter(
            run__allocation_id=ctx.run.allocation_id,
            run__kind=RunKind.PROVISION,
            state=StepState.RUNNING,
            lease_expires_at__gt=timezone.now(),
        )
        .exclude(run=ctx.run)
        .values_list("name", flat=True)
        .first()
    )
    if inflight:
        raise StepPending(f"Waiting for the in-flight step {inflight!r} to stop.", retry_after=1.0)


# --- model serving -----------------------------------------------------------------------------------------


def start_replicas(ctx: StepContext) -> dict:
    """One inference server per replica, on its own allocation's node and devices; a replica still running is
    kept."""
    deployment = deployment_for(ctx.run.request)
    serving = ctx.snapshot["serving"]
    started = {}
    wanted = ctx.run.request.serving_replicas or serving["replicas"]  # woken from zero: fewer than ordered
    for index, (target, allocation_id, devices) in enumerate(_replica_placements(ctx, wanted)):
        replica, _ = ServingReplica.objects.get_or_create(deployment=deployment, name=f"replica-{index}")
        if replica.pid and replica.allocation_id == allocation_id and not probe(replica):
            continue
        ctx.inference.stop_inference(target, replica.pid)  # a half-started one from an interrupted attempt
        instance = ctx.inference.start_inference(target, replica.name, devices, serving)
        replica.url, replica.pid, replica.devices = instance["url"], instance["pid"], instance["devices"]
        replica.allocation_id = allocation_id
        replica.save(update_fields=["url", "pid", "devices", "allocation"])
        started[replica.name] = {**instance, "node": target.node}
    return {"deployment": deployment.slug, "started": started}


def _replica_placements(ctx: StepContext, replicas: int) -> list[tuple[Target, int, list[dict]]]:
    """(target, allocation id, devices) of each replica: the allocation the scheduler bound for it, or, when one
    allocation holds them all (MIG slices, requests placed before replicas were spread), its share of that one."""
    own = list(
        Allocation.objects.filter(request_id=ctx.run.request_id, state=AllocationState.ACTIVE, replica__isnull=False)
        .select_related("node")
        .order_by("replica")
    )
    if len(own) == replicas:
        targets = [allocation_target(ctx.run, allocation, attempt=ctx.target.attempt) for allocation in own]
        return [(target, target.allocation_id, list(target.devices)) for target in targets]
    return [
        (ctx.target, ctx.target.allocation_id, devices)
        for devices in replica_devices(list(ctx.target.devices), replicas)
    ]


def wait_replicas_ready(ctx: StepContext) -> dict:
    """Wait until every replica's server answers (serving.deployments.replicas_not_ready)."""
    deployment = deployment_for(ctx.run.request)
    down = replicas_not_ready(deployment)
    if down:
        raise StepPending(
            f"Waiting for {', '.join(r.name for r in down)} to answer: {down[0].last_error}", retry_after=0.5
        )
    return {"replicas": list(deployment.replicas.values_list("name", flat=True))}


def register_routes(ctx: StepContext) -> dict:
    deployment = deployment_serve(deployment=deployment_for(ctx.run.request))
    return {"route": f"/serve/{deployment.slug}/v1/", "replicas": deployment.replicas.count()}


def publish_endpoint(ctx: StepContext) -> dict:
    deployment = deployment_for(ctx.run.request)
    url = endpoint_url(deployment)
    return {
        **_delivered_base(ctx),
        "host": urlsplit(url).netloc,
        "endpoint": url,
        "model": deployment.model_name,
        "replicas": list(deployment.replicas.values("name", "devices", node=F("allocation__node__name"))),
        "rate_limit_per_minute": deployment.rate_limit_per_minute,
        "monthly_token_budget": deployment.monthly_token_budget,
        "access": {"curl": example_curl(url, deployment.model_name)},
    }


def unregister_routes(ctx: StepContext) -> dict:
    _wait_for_inflight_provisioning(ctx)
    return {"routes_removed": deployment_stop(request=ctx.run.request)}


def stop_replicas(ctx: StepContext) -> dict:
    replicas = list(ServingReplica.objects.filter(deployment__request=ctx.run.request).select_related("allocation"))
    stopped = {
        replica.name: ctx.inference.stop_inference(_replica_target(ctx, replica), replica.pid) for replica in replicas
    }
    ServingReplica.objects.filter(pk__in=[replica.pk for replica in replicas]).update(healthy=False, pid=None)
    routes_changed()
    return {"stopped": stopped}


def _replica_target(ctx: StepContext, replica: ServingReplica) -> Target:
    """Where the replica runs: its own allocation's node, else the run's."""
    if replica.allocation is None or replica.allocation_id == ctx.target.allocation_id:
        return ctx.target
    return allocation_target(ctx.run, replica.allocation, attempt=ctx.target.attempt)
