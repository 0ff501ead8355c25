"""The `simulated` drivers, the embedded default: realistic durations (scaled by PROVISIONING_SIMULATED_SPEED), a
BMC whose state lives in the database so every worker sees the same machine, and fault injection
(PROVISIONING_FAULTS) for tests and demos.

A fault: {"op": <method name>, "attempts": [1, 2] | "all", "node": <optional node name>, and either
"code"/"message"/"retryable" (the call fails), "unavailable": true (the backend does not answer: an outage, waited
out until the fault is gone; "whole_backend": true for the whole simulated backend rather than the node's host), or
"result" (keys merged into what the call returns, e.g. {"op": "inventory", "result": {"accelerators": 7}} for a
server that lost a GPU)}.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.utils import timezone

from catalog.choices import SlurmMembership
from provisioning.drivers.base import (
    BackendUnavailable,
    BmcDriver,
    InBandDriver,
    ServingDriver,
    StepError,
    StepPending,
    Target,
    WorkloadDriver,
    login_name,
    slurm_membership,
    tenant_cluster_name,
    visible_uuid,
)
from scheduling import mig
from serving.deployments import served_model_id

# Seconds a real system takes, roughly; scaled by PROVISIONING_SIMULATED_SPEED.
DURATIONS = {
    "inventory": 3,
    "insert_media": 8,
    "set_one_time_boot": 2,
    "power": 2,
    "power_transition": 25,
    "eject_media": 2,
    "install_os": 300,
    "prepare_image": 45,
    "start_workload": 12,
    "connect_secret_set": 0.5,
    "workload_ready": 6,
    "stop_workload": 8,
    "install_gpu_driver": 120,
    "install_monitoring_agent": 20,
    "register_in_cluster": 15,
    "grant_access": 5,
    "deregister_from_cluster": 8,
    "health_check": 40,
    "request_cleaning": 4,
    "start_inference": 20,
    "stop_inference": 3,
}


def simulated_seconds(operation: str) -> float:
    return DURATIONS[operation] * settings.PROVISIONING_SIMULATED_SPEED


def _work(operation: str, target: Target) -> dict:
    """Spend the operation's time, then apply any injected fault; returns the fault's result overrides."""
    time.sleep(simulated_seconds(operation))
    for fault in settings.PROVISIONING_FAULTS:
        if fault.get("op") != operation or fault.get("node", target.node) != target.node:
            continue
        attempts = fault.get("attempts", "all")
        if attempts != "all" and target.attempt not in attempts:
            continue
        if "result" in fault:
            return dict(fault["result"])
        if fault.get("unavailable"):
            raise BackendUnavailable(
                fault.get("code", "simulated_unavailable"),
                fault.get("message", f"The simulated host of {target.node} does not answer."),
                backend="simulated",
                waiting_for="the simulated cluster" if fault.get("whole_backend") else f"the host of {target.node}",
                whole_backend=fault.get("whole_backend", False),
            )
        raise StepError(
            fault.get("code", "simulated_fault"),
            fault.get("message", f"Injected fault in {operation}."),
            retryable=fault.get("retryable", True),
        )
    return {}


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SimulatedBmc(BmcDriver):
    name = "simulated"

    def _machine(self, target: Target):
        from provisioning.models import SimulatedMachine

        machine, _ = SimulatedMachine.objects.get_or_create(node=target.node)
        if machine.pending_power and machine.power_lands_at <= timezone.now():
            machine.power_state, machine.pending_power, machine.power_lands_at = machine.pending_power, "", None
            machine.save(update_fields=["power_state", "pending_power", "power_lands_at"])
        return machine

    def inventory(self, target: Target) -> dict:
        overrides = _work("inventory", target)
        machine = self._machine(target)
        return {
            "reachable": True,
            "health": "OK",
            "power_state": machine.power_state,
            "cpu_cores": target.inventory.get("cpu_cores"),
            "memory_gb": target.inventory.get("memory_gb"),
            "accelerators": target.inventory.get("accelerators"),
            "processors": None,  # the simulated BMC lists no processors (fault injection may give some)
            "manufacturer": "Simulated",
            "model": "simulated server",
            "system": f"simulated://{target.node}",
            **overrides,
        }

    def insert_media(self, target: Target, image_url: str) -> dict:
        _work("insert_media", target)
        machine = self._machine(target)
        changed = machine.media_image != image_url
        machine.media_image = image_url
        machine.save(update_fields=["media_image"])
        return {"media": "Cd", "changed": changed}

    def set_one_time_boot(self, target: Target, source: str) -> dict:
        _work("set_one_time_boot", target)
        machine = self._machine(target)
        machine.boot_override = source
        machine.save(update_fields=["boot_override"])
        return {"boot_source": source, "enabled": "Once"}

    def power_state(self, target: Target) -> str:
        machine = self._machine(target)
        return f"Powering{machine.pending_power}" if machine.pending_power else machine.power_state

    def power(self, target: Target, action: str) -> dict:
        _work("power", target)
        machine = self._machine(target)
        landing = "Off" if action in ("ForceOff", "GracefulShutdown") else "On"
        if "Restart" in action:
            machine.power_state = "Off"
        machine.pending_power = landing
        machine.power_lands_at = timezone.now() + timedelta(seconds=simulated_seconds("power_transition"))
        machine.save()
        if landing == "On" and machine.boot_override == "Cd" and machine.media_image:
            self._boot_installer(machine)
        return {"reset_type": action}

    def _boot_installer(self, machine) -> None:
        """Booting from the installer media runs the installer, which reports back with the token it was given (the
        task gets the node's name: the token stays in the media URL, as a real BMC keeps it, not in task arguments)."""
        from django_q.tasks import async_task

        machine.boot_override = ""  # a one-time override is spent by the boot
        machine.save(update_fields=["boot_override"])
        if simulated_installer_token(machine.node):
            async_task(
                "provisioning.tasks.simulated_installer",
                machine.node,
                simulated_seconds("install_os") + simulated_seconds("power_transition"),
            )

    def eject_media(self, target: Target) -> dict:
        _work("eject_media", target)
        machine = self._machine(target)
        ejected = bool(machine.media_image)
        machine.media_image = ""
        machine.save(update_fields=["media_image"])
        return {"ejected": ejected}


def simulated_installer_token(node: str) -> str | None:
    """The installer token in the virtual media URL the simulated BMC of this node holds, if any."""
    from provisioning.models import SimulatedMachine

    image = SimulatedMachine.objects.filter(node=node).values_list("media_image", flat=True).first() or ""
    return next(iter(parse_qs(urlsplit(image).query).get("token", [])), None)


def simulated_mig_instances(target: Target) -> dict[int, dict]:
    """What a real host would do on the cards before the work starts, as the scheduler planned it
    (`scheduling.mig.host_commands`): destroy the idle GPU instances in the way, switch the card's mode, create the
    instance repartitioning asked for; the commands, the instances destroyed, and the ids and MIG device UUID the
    driver reports for the new one (deterministic here: from the card's UUID and the placement)."""
    done = {}
    for device in target.devices:
        instance = device.get("mig")
        create = instance if instance and instance.get("create") and not instance.get("uuid") else None
        changes = device.get("mig_changes") or {}
        if create is None and not changes:
            continue
        destroyed = changes.get("destroy", [])
        commands = mig.host_commands(
            device["index"],
            destroy=[gone["gi_id"] for gone in destroyed],
            mode=changes.get("mode"),
            create=(create["profile_id"], create["start"]) if create else None,
        )
        done[device["index"]] = {"gpu": device["index"], "commands": commands, "destroyed": destroyed}
        if create is not None:
            name = f"{device['uuid']}/{create['profile']}@{create['start']}"
            done[device["index"]].update(
                profile=create["profile"],
                start=create["start"],
                gi_id=create["start"] + 1,
                ci_id=0,
                uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, name)}",
            )
    return done


class SimulatedHost(WorkloadDriver, InBandDriver, ServingDriver):
    """One simulated machine plays all three in-band roles: workloads, bare-metal post-install, inference."""

    name = "simulated"

    def probe(self) -> None:
        """The simulated backend as a whole answers unless a fault says it is out (whole_backend)."""
        for fault in settings.PROVISIONING_FAULTS:
            if fault.get("unavailable") and fault.get("whole_backend"):
                raise BackendUnavailable(
                    fault.get("code", "simulated_unavailable"),
                    "The simulated cluster does not answer.",
                    backend=self.name,
                    waiting_for="the simulated cluster",
                    whole_backend=True,
                )

    def prepare_image(self, target: Target, image: dict) -> dict:
        _work("prepare_image", target)
        return {"image": f"{image['name']}:{image['version']}", "reference": image["reference"], "cached": True}

    def start_workload(self, target: Target, image: dict) -> dict:
        overrides = _work("start_workload", target)
        base_port = 20000 + (target.request_id % 2000) * 10
        created = simulated_mig_instances(target)
        return {
            "workload": f"req-{target.request_id}",
            "host": f"{target.node}.compute.internal",
            "ports": {"ssh": base_port + 2, "jupyter": base_port + 8},
            "devices": [
                created.get(device["index"], {}).get("uuid") or visible_uuid(device) for device in target.devices
            ],
            **({"mig_instances": list(created.values())} if created else {}),
            **overrides,
        }

    def connect_secret_names(self, target: Target) -> tuple[str, ...]:
        return ("jupyter",)  # the simulated workspace publishes a Jupyter port, opened with the requester's token

    def connect_secret_set(self, target: Target, name: str, value: str) -> None:
        _work("connect_secret_set", target)

    def workload_ready(self, target: Target, started: dict) -> dict:
        overrides = _work("workload_ready", target)
        if overrides.get("ready") is False:
            raise StepPending("The workload is not answering its readiness probe yet.", retry_after=2)
        return {"ready": True}

    def stop_workload(self, target: Target) -> dict:
        _work("stop_workload", target)
        destroyed = [
            {"gpu": device["index"], "commands": mig.destroy_commands(device["index"], device["mig"]["gi_id"])}
            for device in target.devices
            if device.get("mig") and device["mig"].get("create")
        ]
        return {
            "workload": f"req-{target.request_id}",
            "stopped": True,
            **({"mig_instances_destroyed": destroyed} if destroyed else {}),
        }

    def install_gpu_driver(self, target: Target, version: str) -> dict:
        _work("install_gpu_driver", target)
        return {"driver_version": version, "accelerators_visible": len(target.devices)}

    def install_monitoring_agent(self, target: Target, agent: str, gpu_exporter: str = "") -> dict:
        _work("install_monitoring_agent", target)
        return {"agent": agent, "reporting": True, **({"gpu_exporter": gpu_exporter} if gpu_exporter else {})}

    def register_in_cluster(self, target: Target, cluster: str) -> dict:
        membership = slurm_membership(target)
        if membership == SlurmMembership.NONE:
            return {"slurm_membership": membership, "cluster": None, "registered": False}
        _work("register_in_cluster", target)
        own = membership == SlurmMembership.TENANT_CLUSTER
        cluster = tenant_cluster_name(target) if own else cluster
        return {
            "slurm_membership": membership,
            "cluster": cluster,
            "node_name": target.node,
            "address": f"{target.node}.{cluster}.internal",
            "munge_key": "the server's own" if own else "the shared cluster's",
        }

    def grant_access(self, target: Target, *, ssh_public_keys: list[str], root: bool) -> dict:
        _work("grant_access", target)
        return {"user": login_name(target.requester), "ssh_keys": len(ssh_public_keys), "root": root}

    def deregister_from_cluster(self, target: Target, cluster: str) -> dict:
        _work("deregister_from_cluster", target)
        return {"cluster": cluster, "deregistered": True}

    def health_check(self, target: Target, checks: list[str]) -> dict:
        overrides = _work("health_check", target)
        return {
            "checks": {
                check: "passed" for check in ["driver_loaded", "accelerators_visible", "agent_reporting", *checks]
            },
            **overrides,
        }

    def start_inference(self, target: Target, replica: str, devices: list[dict], serving: dict) -> dict:
        """The project's own OpenAI-compatible server as a local process on a free loopback port."""
        _work("start_inference", target)
        port = _free_loopback_port()
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serving.inference_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--model",
                served_model_id(serving),
                "--replica",
                replica,
                "--max-tokens",
                str(serving["max_tokens"]),
                "--context-length",
                str(serving["context_length"]),
            ],
            cwd=settings.BASE_DIR,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return {
            "url": f"http://127.0.0.1:{port}",
            "pid": process.pid,
            "devices": [device["uuid"] for device in devices],
        }

    def stop_inference(self, target: Target, pid: int | None) -> dict:
        _work("stop_inference", target)
        if pid is None:
            return {"stopped": False}
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return {"stopped": False, "pid": pid}
        return {"stopped": True, "pid": pid}

    def request_cleaning(self, target: Target) -> dict:
        _work("request_cleaning", target)
        return {"cleaning": "queued", "wipe": "secure-erase", "firmware": "reset to baseline"}
