"""The `ansible` in-band driver: a bare-metal server's post-install steps as Ansible playbooks over SSH.

Each step runs `ansible-playbook` (ansible-core in its own virtualenv, `make ansible-venv`; ANSIBLE_PLAYBOOK) as a
subprocess against the delivered server, with the step's timeout, the repo's JSON callback
(provisioning/playbooks/callback_plugins/step_json.py) and the playbooks of the profile's versioned set
(provisioning/playbooks/<profile playbooks>/<step>.yml). The profile's driver version, agent and target cluster come
from the approved snapshot, unchanged. Outcome:

- every task ok or changed: success; the output holds the playbook's summary (ok/changed/... counts) and what it
  recorded (set_stats), a rerun on a server where the step already succeeded reports changed=0;
- a task failed: a StepError naming the task and its message, permanent when the task is tagged `permanent`,
  retryable otherwise;
- the host unreachable over SSH: retryable (the engine retries until the step's attempts run out), except a host
  key that no longer matches the one recorded on first contact, which is permanent.

SSH: the login and key come from the node's ssh_credentials_ref (provisioning.secrets), only the key's path reaches
ansible; host keys are recorded per node (ANSIBLE_STATE_DIR/known_hosts/<node>, StrictHostKeyChecking=accept-new)
and forgotten when the server is marked for cleaning (it is reinstalled before its next tenant). Pipelining and
ControlPersist keep the SSH cost of a step to one connection.

What the control plane checks itself after a playbook: the agent's /metrics answer (HTTP from here) and the profile's
GPU exporter's (dcgm-exporter's metric names, every allocated card by UUID), the node's state in the target Slurm
cluster (slurmrestd), and, on release, the node's removal (`scontrol delete`).

A playbook never outlives its step's attempt: killed with its worker (pdeathsig), and whatever of it is left (found by
a token in its processes' environment) killed on timeout or by the next attempt (docs/provisioning.md).
"""

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from django.conf import settings

from catalog.choices import TENANT_ROOT_MEMBERSHIPS, SlurmMembership
from config.ssh_keys import ssh_public_key_problem
from provisioning.drivers.base import (
    InBandDriver,
    StepError,
    StepPending,
    Target,
    login_name,
    scontrol_outage,
    slurm_membership,
    tenant_cluster_name,
)
from provisioning.secrets import ssh_credentials

PLAYBOOK_DIR = Path(__file__).resolve().parent.parent / "playbooks"
DEFAULT_PLAYBOOKS = "bare-metal-v1"
DEFAULT_TIMEOUT_SECONDS = 900
LOG_EXCERPT_TASKS = 12
DRIVER_PACKAGE = "cc-gpu-driver"
GPU_UTILIZATION = "DCGM_FI_DEV_GPU_UTIL"  # the dcgm-exporter metric every card must report
NODE_IDLE_WAIT_SECONDS = 30.0
# Host-specific settings of the cluster's slurm.conf that a server joining it replaces with its own.
HOST_LOCAL_SLURM_KEYS = {
    "slurmctldhost",
    "authinfo",
    "authalttypes",
    "authaltparameters",
    "slurmdspooldir",
    "slurmdpidfile",
    "slurmdlogfile",
    "slurmctldpidfile",
    "slurmctldlogfile",
    "statesavelocation",
}
logger = logging.getLogger(__name__)
RUN_TOKEN = "CC_PLAYBOOK_RUN"  # in the environment of every process of one playbook run, to find them all
SAFE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+~-]*$")


class AnsibleHost(InBandDriver):
    name = "ansible"

    def __init__(self, timeout: float | None = None):
        self.timeout = timeout or DEFAULT_TIMEOUT_SECONDS

    # --- steps -----------------------------------------------------------------------------------------------

    def install_gpu_driver(self, target: Target, version: str) -> dict:
        package = _driver_package(version)
        result = self._play(target, "install_gpu_driver", {"cc_driver_version": version, "cc_driver_package": package})
        installed = result["facts"].get("driver_version")
        return {"driver_version": installed, "package": Path(package).name, "ansible": result["summary"]}

    def install_monitoring_agent(self, target: Target, agent: str, gpu_exporter: str = "") -> dict:
        port, gpu_port = settings.INBAND_METRICS_PORT, settings.INBAND_GPU_METRICS_PORT
        uuids = {str(device["index"]): device["uuid"] for device in target.devices}
        exporter_config = {
            "hostname": target.node,
            "model": target.snapshot["bare_metal_profile"]["accelerator_model"],
            "uuids": uuids,
        }
        result = self._play(
            target,
            "install_monitoring_agent",
            {"cc_agent": agent, "cc_metrics_port": port, "cc_gpu_exporter": gpu_exporter,
             "cc_gpu_metrics_port": gpu_port, "cc_gpu_exporter_config": exporter_config},
        )  # fmt: skip
        endpoint = f"http://{_host_of(target)}:{port}/metrics"
        _metrics_answer(endpoint)
        output = {
            "agent": agent,
            "agent_package": result["facts"].get("agent_package"),
            "endpoint": endpoint,
            "reporting": True,
        }
        if gpu_exporter:
            gpu_endpoint = f"http://{_host_of(target)}:{gpu_port}/metrics"
            output |= {
                "gpu_exporter": gpu_exporter,
                "gpu_exporter_endpoint": gpu_endpoint,
                "gpu_series": _gpu_metrics_answer(gpu_endpoint, set(uuids.values())),
            }
        return {**output, "ansible": result["summary"]}

    def register_in_cluster(self, target: Target, cluster: str) -> dict:
        membership = slurm_membership(target)
        if membership == SlurmMembership.NONE:
            return {"slurm_membership": membership, "cluster": None, "registered": False}
        if membership == SlurmMembership.TENANT_CLUSTER:
            return self._run_own_cluster(target)
        slurm_conf, gres_conf, node_conf = _slurm_files(target, cluster)
        result = self._play(
            target,
            "register_in_cluster",
            {
                "cc_node": target.node,
                "cc_slurm_conf": slurm_conf,
                "cc_gres_conf": gres_conf,
                "cc_slurmd_conf": node_conf,
                "cc_munge_key_file": settings.INBAND_MUNGE_KEY_FILE,
            },
        )
        state = _await_slurm_node(target.node, idle=True)
        return {
            "slurm_membership": membership,
            "cluster": cluster,
            "node_name": target.node,
            "address": _host_of(target),
            "slurm_state": state,
            "gres": node_conf.split("Gres=", 1)[1].split()[0],
            "munge_key": "the shared cluster's",
            "ansible": result["summary"],
        }

    def _run_own_cluster(self, target: Target) -> dict:
        """A tenant_cluster server: a one-server cluster of its own, with a munge key made on the server; never the
        shared cluster's key, which the playbook replaces and the driver checks for by fingerprint."""
        name = tenant_cluster_name(target)
        gres_conf, gres = _gres(target)
        shared_key = _shared_key_fingerprint()
        result = self._play(
            target,
            "register_in_tenant_cluster",
            {
                "cc_node": target.node,
                "cc_slurm_conf": _tenant_slurm_conf(target, name, gres),
                "cc_gres_conf": gres_conf,
                "cc_shared_munge_key_sha256": shared_key,
            },
        )
        if shared_key and result["facts"].get("munge_key_sha256") == shared_key:
            raise StepError(
                "shared_munge_key_on_tenant_server",
                f"{target.node} holds the shared cluster's munge key, and its tenant has root there.",
                retryable=False,
                details={"ansible": result["summary"]},
            )
        return {
            "slurm_membership": SlurmMembership.TENANT_CLUSTER,
            "cluster": name,
            "node_name": target.node,
            "address": _host_of(target),
            "slurm_state": result["facts"].get("slurm_state"),
            "gres": gres,
            "munge_key": "the server's own",
            "ansible": result["summary"],
        }

    def grant_access(self, target: Target, *, ssh_public_keys: list[str], root: bool) -> dict:
        keys = [key.strip() for key in ssh_public_keys]
        for key in keys:  # each one line the platform's key rule accepts, so nothing else reaches authorized_keys
            problem = ssh_public_key_problem(key)
            if problem:
                raise StepError("ssh_public_key_invalid", f"An SSH key to install {problem}.", retryable=False)
        user = login_name(target.requester)
        variables = {"cc_user": user, "cc_ssh_public_keys": keys, "cc_tenant_root": root}
        result = self._play(target, "grant_access", variables)
        return {
            "user": user,
            "ssh_keys": len(keys),
            "root": root,
            "address": _host_of(target),
            "ansible": result["summary"],
        }

    def deregister_from_cluster(self, target: Target, cluster: str) -> dict:
        from scheduling.slurm import scontrol

        membership = slurm_membership(target)
        shared = membership == SlurmMembership.SHARED_CLUSTER_NO_ROOT
        try:
            result = self._play(
                target, "deregister_from_cluster", {"cc_node": target.node, "cc_slurm_membership": membership}
            )
        except StepError as locked_out:
            # A tenant with root may have taken the platform's key or host key away. Nothing of the shared cluster
            # is on such a server, power-off follows and it is reinstalled before its next tenant: not a reason to
            # fail the release and isolate the node.
            if shared or locked_out.code not in ("host_unreachable", "host_key_mismatch"):
                raise
            return {"slurm_membership": membership, "deregistered": False, "skipped": locked_out.message}
        if not shared:  # nothing of the shared cluster to undo
            own = tenant_cluster_name(target) if membership == SlurmMembership.TENANT_CLUSTER else None
            return {"slurm_membership": membership, "cluster": own, "deregistered": True, "ansible": result["summary"]}
        removed = True
        try:
            scontrol.delete_node(target.node)
        except scontrol.ScontrolUnreachable as error:
            raise scontrol_outage(error) from error
        except scontrol.ScontrolError as error:
            if "invalid node name" not in str(error).lower():
                raise StepError("cluster_deregistration_failed", str(error)) from error
            removed = False  # already gone: a rerun after an interrupted attempt
        _await_slurm_node(target.node, idle=False)
        return {"cluster": cluster, "node_name": target.node, "deregistered": True, "removed_now": removed,
                "slurm_membership": membership, "ansible": result["summary"]}  # fmt: skip

    def health_check(self, target: Target, checks: list[str]) -> dict:
        indexes = [device["index"] for device in target.devices]
        profile = target.snapshot["bare_metal_profile"]
        membership = slurm_membership(target)
        root = membership in TENANT_ROOT_MEMBERSHIPS
        result = self._play(
            target,
            "health_check",
            {
                "cc_driver_version": profile["driver_version"],
                "cc_device_indexes": indexes,
                "cc_metrics_port": settings.INBAND_METRICS_PORT,
                "cc_slurm_membership": membership,
                "cc_user": login_name(target.requester),
                "cc_tenant_root": root,
            },
        )
        if membership == SlurmMembership.SHARED_CLUSTER_NO_ROOT:
            cluster_node = f"passed ({_await_slurm_node(target.node, idle=True)})"
        elif membership == SlurmMembership.TENANT_CLUSTER:
            cluster_node = f"passed ({result['facts'].get('slurm_state')} in its own cluster)"
        else:
            cluster_node = "not in a cluster (the profile joins none)"
        outcome = {
            "driver_loaded": f"passed ({result['facts'].get('driver_version')})",
            "accelerators_visible": f"passed ({len(indexes)} device nodes)",
            "agent_reporting": "passed",
            "cluster_node_idle": cluster_node,
            "tenant_root": "granted (sudo)" if root else "passed (none: no sudo rule, no privileged group)",
        }
        for check in checks:  # profile checks this driver has no tool for on the host are said to be not run
            outcome.setdefault(check, "not run (no tool for it on the host)")
        return {"checks": outcome, "ansible": result["summary"]}

    def request_cleaning(self, target: Target) -> dict:
        """The server is reinstalled before its next tenant: its host key will change, so the recorded one goes."""
        known_hosts = _known_hosts(target.node)
        forgotten = known_hosts.exists()
        known_hosts.unlink(missing_ok=True)
        return {"cleaning_requested": True, "host_key_forgotten": forgotten}

    # --- ansible-playbook ------------------------------------------------------------------------------------

    def _play(self, target: Target, step: str, variables: dict) -> dict:
        """Run one playbook of the profile's set against the server; the parsed result or a StepError."""
        playbook = _playbook(target, step)
        credentials = ssh_credentials(target.ssh_credentials_ref)
        if credentials is None:
            raise StepError(
                "ssh_credentials_missing",
                f"No SSH credentials are configured under the name {target.ssh_credentials_ref!r} for {target.node}.",
                retryable=False,
            )
        user, key_file = credentials
        host, port = _address(target)
        with tempfile.TemporaryDirectory(prefix="cc-ansible-") as work:
            work = Path(work)
            inventory = work / "inventory.json"
            inventory.write_text(
                json.dumps(
                    {
                        "all": {
                            "hosts": {
                                target.node: {
                                    "ansible_host": host,
                                    "ansible_port": port,
                                    "ansible_user": user,
                                    "ansible_ssh_private_key_file": key_file,
                                    "ansible_python_interpreter": "/usr/bin/python3",
                                }
                            }
                        }
                    }
                )
            )
            extra = work / "vars.json"
            extra.write_text(json.dumps(variables))
            extra.chmod(0o600)
            started = time.monotonic()
            missing = [program for program in (settings.ANSIBLE_PLAYBOOK, "setpriv") if not shutil.which(program)]
            if missing:
                raise StepError(
                    "ansible_missing",
                    f"{' and '.join(missing)} not installed on the control plane (make ansible-venv; setpriv is "
                    "util-linux's).",
                    retryable=False,
                )
            try:
                done = _run_playbook(
                    [settings.ANSIBLE_PLAYBOOK, "-i", str(inventory), "-e", f"@{extra}", str(playbook)],
                    env=_environment(target, work),
                    timeout=self.timeout,
                    node=target.node,
                )
            except subprocess.TimeoutExpired as slow:
                raise StepError(
                    "playbook_timeout",
                    f"The {step} playbook ran for more than {slow.timeout:g} s on {target.node} ({host}).",
                    details={"playbook": _relative(playbook), "host": target.node},
                ) from slow
        seconds = round(time.monotonic() - started, 3)
        return _outcome(target, step, playbook, done, seconds)


def _run_playbook(command: list[str], *, env: dict, timeout: float, node: str) -> subprocess.CompletedProcess:
    """ansible-playbook in a session of its own, every process of it (its forks, which ansible detaches into sessions
    of their own, and their ssh) marked by a token in its environment: on timeout all of them are killed.

    A worker killed during the playbook (SIGKILL: no chance to clean up) must not leave it running beside the step's
    next attempt: the playbook dies with the worker (`setpriv --pdeathsig KILL`), and the run's token is recorded per
    node, so the next attempt on this machine first kills whatever of that run is left (the fork running the task
    that was in flight, its ssh client). See docs/provisioning.md, "A worker killed during a playbook"."""
    _end_leftover_playbook(node)
    token = uuid.uuid4().hex
    process = subprocess.Popen(
        ["setpriv", "--pdeathsig", "KILL", "--", *command],
        env={**env, RUN_TOKEN: token},
        cwd=PLAYBOOK_DIR,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    marker = _running_marker(node)
    marker.write_text(f"{process.pid} {token}")
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_run(token)
        process.communicate()
        raise
    finally:
        marker.unlink(missing_ok=True)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _running_marker(node: str) -> Path:
    """`<leader pid> <token>` of the playbook running against the node from this machine, while it runs."""
    marker = Path(settings.ANSIBLE_STATE_DIR) / "running" / re.sub(r"[^A-Za-z0-9._-]", "_", node)
    marker.parent.mkdir(parents=True, exist_ok=True)
    return marker


def _end_leftover_playbook(node: str) -> None:
    """Kill what is left of a playbook a dead worker ran against this node."""
    marker = _running_marker(node)
    with contextlib.suppress(FileNotFoundError, ValueError):
        _, token = marker.read_text().split()
        if killed := _kill_run(token):
            logger.warning("Killed %s processes left of a dead worker's playbook on %s", killed, node)
    marker.unlink(missing_ok=True)


def playbook_processes(token: str) -> dict[int, str]:
    """{pid: command line} of the live processes of one playbook run (zombies, dead but not yet reaped, are not)."""
    mark = f"{RUN_TOKEN}={token}".encode()
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):  # a process that ended while we looked, or not ours to read
            if mark not in environ.read_bytes().split(b"\0"):
                continue
            state = (environ.parent / "stat").read_text().rpartition(")")[2].split()[0]
            if state != "Z":
                found[int(environ.parent.name)] = (
                    (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                )
    return found


def _kill_run(token: str) -> int:
    """SIGKILL every process of the run, until none is left (briefly: a process being forked may join late)."""
    killed, deadline = 0, time.monotonic() + 10
    while (processes := playbook_processes(token)) and time.monotonic() < deadline:
        for pid in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.05)
    return killed


def _outcome(target: Target, step: str, playbook: Path, done: subprocess.CompletedProcess, seconds: float) -> dict:
    try:
        document = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise StepError(
            "playbook_error",
            f"ansible-playbook {step} exited with {done.returncode} without a result: "
            f"{(done.stderr or done.stdout).strip()[-500:] or 'no output'}",
            details={"playbook": _relative(playbook), "host": target.node},
        ) from None
    stats = document["stats"].get(target.node, {})
    summary = {
        "playbook": _relative(playbook),
        "host": target.node,
        # Ansible's own counts (its summary calls failed tasks "failures").
        **{key: stats.get(key, 0) for key in ("ok", "changed", "unreachable", "skipped")},
        "failed": stats.get("failures", 0),
        "seconds": seconds,
        "log": [_log_line(task) for task in document["tasks"][-LOG_EXCERPT_TASKS:]],
    }
    details = {"ansible": summary}
    unreachable = next((task for task in document["tasks"] if task["status"] == "unreachable"), None)
    if unreachable:
        message = unreachable["msg"]
        host = _address(target)[0]
        if "host identification has changed" in message.lower() or "host key verification failed" in message.lower():
            raise StepError(
                "host_key_mismatch",
                f"Step {step}: {target.node} ({host}) presented a host key other than the one recorded on first "
                "contact.",
                retryable=False,
                details=details,
            )
        raise StepError(
            "host_unreachable",
            f"Step {step}: {target.node} ({host}) is unreachable over SSH: {message}",
            details=details,
        )
    failed = next((task for task in document["tasks"] if task["status"] == "failed"), None)
    if failed or done.returncode != 0:
        task = failed or {"task": "(none)", "msg": (done.stderr or "").strip()[-500:], "permanent": False}
        raise StepError(
            "playbook_task_failed",
            f"Step {step} on {target.node}: task '{task['task']}' failed: {task['msg']}",
            retryable=not task["permanent"],
            details={**details, "task": task["task"]},
        )
    facts = document.get("facts", {}).get("_run", {})
    return {"summary": summary, "facts": facts}


def _log_line(task: dict) -> str:
    changed = " (changed)" if task["changed"] else ""
    message = f": {task['msg'][:200]}" if task["status"] in ("failed", "unreachable") and task["msg"] else ""
    return f"{task['status']}{changed}: {task['task']}{message}"


def _control_socket_dir(state: Path) -> Path:
    """Where ssh keeps its ControlPersist sockets: a short directory of its own (the temporary directory plus a hash
    of the state directory, private to this user), since a Unix socket's path holds at most 107 bytes and ssh adds
    a 10-character hash and a 17-character temporary suffix to it; under a deep ANSIBLE_STATE_DIR it would not
    fit and every connection would fail."""
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:12]
    control = Path(tempfile.gettempdir()) / f"cc-ansible-cp-{digest}"
    control.mkdir(mode=0o700, exist_ok=True)
    return control


def _environment(target: Target, work: Path) -> dict:
    state = Path(settings.ANSIBLE_STATE_DIR)
    control = _control_socket_dir(state)
    known_hosts = _known_hosts(target.node)
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    timeout = settings.ANSIBLE_CONNECT_TIMEOUT_SECONDS
    ssh_args = (
        f"-o ControlMaster=auto -o ControlPersist=60s -o BatchMode=yes -o ConnectTimeout={timeout} "
        f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=accept-new -o ServerAliveInterval=10 "
        # The key is the node's, whatever address it answers at: a new address does not pass for first contact.
        f"-o HostKeyAlias={re.sub(r'[^A-Za-z0-9._-]', '_', target.node)}"
    )
    keep = {key: value for key, value in os.environ.items() if key in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")}
    return {
        **keep,
        "ANSIBLE_CONFIG": str(PLAYBOOK_DIR / "ansible.cfg"),
        "ANSIBLE_HOME": str(state / "home"),
        "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
        "ANSIBLE_STDOUT_CALLBACK": "step_json",
        "ANSIBLE_CALLBACK_PLUGINS": str(PLAYBOOK_DIR / "callback_plugins"),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": ssh_args,
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_TIMEOUT": str(timeout),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_FORCE_COLOR": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    }


def _known_hosts(node: str) -> Path:
    return Path(settings.ANSIBLE_STATE_DIR) / "known_hosts" / re.sub(r"[^A-Za-z0-9._-]", "_", node)


def _playbook(target: Target, step: str) -> Path:
    name = target.snapshot["bare_metal_profile"].get("playbooks") or DEFAULT_PLAYBOOKS
    playbook = PLAYBOOK_DIR / name / f"{step}.yml"
    if "/" in name or not playbook.is_file():
        raise StepError(
            "playbook_missing",
            f"The profile's playbook set {name!r} has no {step}.yml under {_relative(PLAYBOOK_DIR)}.",
            retryable=False,
        )
    return playbook


def _relative(path: Path) -> str:
    return str(path.relative_to(PLAYBOOK_DIR.parent.parent))


def _address(target: Target) -> tuple[str, int]:
    address = target.os_address or target.node
    host, _, port = address.rpartition(":") if address.count(":") == 1 else (address, "", "")
    return host, int(port or 22)


def _host_of(target: Target) -> str:
    return _address(target)[0]


def _driver_package(version: str) -> str:
    found = sorted(Path(settings.INBAND_PACKAGE_DIR).glob(f"{DRIVER_PACKAGE}_{version}_*.deb"))
    if not SAFE_VERSION.match(version) or not found:
        raise StepError(
            "driver_package_missing",
            f"No {DRIVER_PACKAGE} package of version {version!r} in {settings.INBAND_PACKAGE_DIR}.",
            retryable=False,
        )
    return str(found[-1])


def _metrics_answer(endpoint: str) -> None:
    """The agent is reporting when its /metrics answers with node metrics (retryable: it may still be starting)."""
    try:
        response = httpx.get(endpoint, timeout=5)
    except httpx.HTTPError as error:
        raise StepError("agent_not_reporting", f"{endpoint} does not answer: {error}") from error
    if response.status_code != 200 or "node_" not in response.text:
        raise StepError("agent_not_reporting", f"{endpoint} answered {response.status_code} without node metrics.")


def _gpu_metrics_answer(endpoint: str, uuids: set[str]) -> int:
    """The GPU exporter reports utilization for every card of the server, by UUID (as metering's dcgm scraper reads
    it); how many cards it reports. Retryable: it may still be starting."""
    from scheduling.inventory.health import parse_dcgm_text

    try:
        response = httpx.get(endpoint, timeout=5)
        response.raise_for_status()
        samples = parse_dcgm_text(response.text)
    except (httpx.HTTPError, ValueError) as error:
        raise StepError("gpu_exporter_not_reporting", f"{endpoint} gives no GPU metrics: {error}") from error
    reported = {sample.device_uuid for sample in samples if sample.signal == GPU_UTILIZATION}
    if missing := sorted(uuids - reported):
        raise StepError(
            "gpu_exporter_not_reporting",
            f"{endpoint} reports no {GPU_UTILIZATION} for {', '.join(missing)}.",
            details={"missing": missing},
        )
    return len(reported & uuids)


# --- Slurm -------------------------------------------------------------------------------------------------


def _slurm_files(target: Target, cluster: str) -> tuple[str, str, str]:
    """slurm.conf for the server (the cluster's, with the controller at the address servers reach it and the
    host-local paths its own), its gres.conf, and the dynamic node's definition (`slurmd -Z --conf`)."""
    if not settings.SLURM_CONF or not Path(settings.SLURM_CONF).is_file():
        raise StepError("cluster_not_configured", "SLURM_CONF names no Slurm configuration to join.", retryable=False)
    lines, name, controller = [], None, None
    for line in Path(settings.SLURM_CONF).read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() == "clustername":
            name = value.strip()
        if key.strip().lower() == "slurmctldhost":
            controller = value.strip().split("(")[0]
        if key.strip().lower() in HOST_LOCAL_SLURM_KEYS or key.startswith(("NodeName=", "PartitionName=")):
            continue
        lines.append(line)
    if name != cluster:
        raise StepError(
            "cluster_unknown",
            f"The profile's target cluster {cluster!r} is not the configured Slurm cluster {name!r}.",
            retryable=False,
        )
    address = settings.INBAND_SLURMCTLD_ADDRESS
    if not address:
        raise StepError(
            "cluster_not_configured", "INBAND_SLURMCTLD_ADDRESS names no controller address.", retryable=False
        )
    partitions = [
        line for line in Path(settings.SLURM_CONF).read_text().splitlines() if line.startswith("PartitionName=")
    ]
    lines += [
        f"SlurmctldHost={controller}({address})",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmdLogFile=/var/log/slurmd.log",
        *partitions,
    ]
    gres_conf, gres = _gres(target)
    node_conf = f"Gres={gres} NodeAddr={_host_of(target)}"
    return "\n".join(lines) + "\n", gres_conf, node_conf


def _gres(target: Target) -> tuple[str, str]:
    """gres.conf for the server's allocated GPUs, and its GRES (gpu:<type>:<n>)."""
    gpu_type = re.sub(r"[^A-Za-z0-9]", "", target.snapshot["bare_metal_profile"]["accelerator_model"]) or "gpu"
    indexes = sorted(device["index"] for device in target.devices)
    files = ",".join(f"/dev/nvidia{index}" for index in indexes)
    return f"AutoDetect=off\nName=gpu Type={gpu_type} File={files}\n", f"gpu:{gpu_type}:{len(indexes)}"


def _tenant_slurm_conf(target: Target, name: str, gres: str) -> str:
    """slurm.conf of a tenant_cluster server's one-server cluster: controller and node on the server itself, its
    cores and memory as the inventory records them (hardware validation held the BMC to them). The playbook puts the
    server's hostname in front (SlurmctldHost must be it)."""
    settings = {
        "ClusterName": name,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "StateSaveLocation": "/var/spool/slurmctld",
        "SlurmdSpoolDir": "/var/spool/slurmd",
        "SlurmctldPidFile": "/run/slurmctld.pid",
        "SlurmdPidFile": "/run/slurmd.pid",
        "SlurmctldLogFile": "/var/log/slurmctld.log",
        "SlurmdLogFile": "/var/log/slurmd.log",
        "SlurmdParameters": "config_overrides",
        "GresTypes": "gpu",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/none",
        "MpiDefault": "none",
        "MailProg": "/bin/true",
        "ReturnToService": 2,
    }
    cores, memory_gb = target.inventory.get("cpu_cores") or 1, target.inventory.get("memory_gb") or 1
    lines = [f"{key}={value}" for key, value in settings.items()]
    lines += [
        f"NodeName={target.node} NodeAddr=127.0.0.1 CPUs={cores} RealMemory={memory_gb * 1024} Gres={gres} "
        "State=UNKNOWN",
        f"PartitionName={name} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def _shared_key_fingerprint() -> str:
    """SHA-256 of the shared cluster's munge key (INBAND_MUNGE_KEY_FILE), "" when none is configured: a
    tenant_cluster server's key must never be it."""
    key = Path(settings.INBAND_MUNGE_KEY_FILE) if settings.INBAND_MUNGE_KEY_FILE else None
    return hashlib.sha256(key.read_bytes()).hexdigest() if key and key.is_file() else ""


def _await_slurm_node(node: str, *, idle: bool) -> str:
    """slurmrestd's word on the node: listed and idle (idle=True), or no longer listed (idle=False)."""
    from scheduling.slurm.api import SlurmApi, SlurmApiError, SlurmNotFound
    from scheduling.slurm.nodes import SlurmNodeState

    deadline = time.monotonic() + NODE_IDLE_WAIT_SECONDS
    state = "not listed"
    while True:
        try:
            with SlurmApi.from_settings() as api:
                listed = {entry["name"]: entry for entry in api.nodes()}
        except SlurmNotFound:
            listed = {}
        except SlurmApiError as error:
            raise StepError("cluster_unreachable", f"slurmrestd could not be asked about {node}: {error}") from error
        entry = listed.get(node)
        node_state = None if entry is None else SlurmNodeState.of(entry)
        state = "not listed" if node_state is None else node_state.label
        # A dynamic node reads IDLE+DYNAMIC_NORM: idle, with no flag that keeps work off it.
        if idle and node_state is not None and node_state.base == "idle" and not node_state.unavailable:
            return state
        if not idle and entry is None:
            return state
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if idle:
        raise StepPending(f"{node} is {state} in the cluster, not idle yet.", retry_after=2.0)
    raise StepError("cluster_deregistration_failed", f"{node} is still listed in the cluster ({state}).")


def clear_control_sockets() -> None:
    """Remove this host's persisted SSH control sockets (tests: the servers they reached are gone)."""
    shutil.rmtree(_control_socket_dir(Path(settings.ANSIBLE_STATE_DIR)), ignore_errors=True)
