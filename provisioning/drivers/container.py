"""The `container` execution backend: a compute order's workspace as a podman container on the allocated node.

podman is reached through its remote interface only (CONTAINER_PODMAN_URL, e.g. `ssh://root@{node}/run/podman/
podman.sock` or the `unix://` socket of a local `podman system service`): the control plane runs the podman client,
the node runs the containers.

- Image: a catalog image whose reference is `containerfile:<name>` is built from CONTAINER_IMAGE_DIR/<name>/
  (no registry needed), tagged with the hash of that directory's files, and verified against the digest recorded at
  its first build; a context with a `rootfs.sh` gets the root filesystem it writes (a debootstrap'd Debian) built
  once into CONTAINER_IMAGE_CACHE. Any other reference is pulled.
- Run: one container per allocation, labelled with the request and allocation ids (a retry finds the container it
  already started), the allocated devices bound (device nodes, or CDI names on nodes with a CDI spec),
  NVIDIA_VISIBLE_DEVICES with their UUIDs, CPU and memory limits from the approved demand, SSH (and Jupyter when
  ordered) published on the node. The requester's account accepts the order's `ssh_public_key` and every key on
  their profile (tenancy.ssh_keys), read when the workspace starts.
- Ready when sshd answers with its banner (and Jupyter's API answers, when it runs): real probes of the published
  ports, from the control plane.
- A multi-node gang (`target.gang`, the leader's run) runs as one container per member on each member's node, all
  started or none: member 0 first, then the others, each told where member 0 is; when one cannot start, every
  member's container is removed and the step fails (and is retried) as one. The members share
  CONTAINER_GANG_NETWORK and get the rendezvous environment torchrun reads (`rendezvous_environment`). Ready when
  every member is; one member's container ending ends the gang (the reconciler), and teardown removes all of them.
- Jupyter's token is the platform's (provisioning/connect.py): it is written into the running container through
  `podman exec --interactive ... workspace-secret jupyter` on standard input (never an argument or an environment
  variable, which `podman inspect` and `ps` show), and the notebook's sign-in reads it on every request, so a new
  one takes effect at once and the old one, and every sign-in made with it, stops working.
"""

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
from django.conf import settings

from provisioning.drivers.base import (
    BackendUnavailable,
    StepError,
    StepPending,
    Target,
    WorkloadDriver,
    WorkloadEnd,
    each,
    login_name,
    member_target,
    node_share,
    visible_uuid,
)
from provisioning.drivers.keys import requester_keys

BUILT_PREFIX = "containerfile:"
INSTANCE_LABEL = "compute-catalog.instance"
REQUEST_LABEL = "compute-catalog.request"
ALLOCATION_LABEL = "compute-catalog.allocation"
SSH_PORT, JUPYTER_PORT = 22, 8888
PROBE_TIMEOUT_SECONDS = 2.0
PROBE_AGAIN_SECONDS = 0.25
STOP_GRACE_SECONDS = 5
LOG_TAIL_LINES = 20
ENDED_STATES = {"exited", "stopped", "dead"}
CONTEXT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # a directory right under CONTAINER_IMAGE_DIR, nothing else


class PodmanFailed(StepError):
    """podman answered with an error: worth retrying (the step's attempts), and most failures are."""

    def __init__(self, command: str, stderr: str):
        super().__init__(
            "podman_failed", f"podman {command} failed: {stderr[-500:] or 'no output'}", details={"command": command}
        )
        self.stderr = stderr


UNREACHABLE_SIGNS = ("cannot connect", "unable to connect", "failed to connect")


def podman_unreachable(url: str, command: str, stderr: str) -> BackendUnavailable | None:
    """The node's podman service did not answer (its socket or SSH down, the node rebooting): an outage of that
    node's service, waited out; None when podman answered."""
    if not any(sign in stderr.lower() for sign in UNREACHABLE_SIGNS):
        return None
    return BackendUnavailable(
        "podman_unreachable",
        f"podman {command} failed: {stderr[-500:]}",
        backend="container",
        waiting_for=f"podman at {url}",
        details={"command": command},
    )


class Podman:
    """The podman remote client, pointed at one node's podman service."""

    def __init__(self, url: str):
        self.url = url

    @classmethod
    def of(cls, node: str) -> "Podman":
        return cls(settings.CONTAINER_PODMAN_URL.format(node=node))

    def run(self, *args: str, timeout: float | None = None, with_stderr: bool = False, stdin: str | None = None) -> str:
        """The command's output (with what it wrote to stderr, for `logs`); PodmanFailed when it fails. `stdin` is
        what the command reads (a secret goes there, never into its arguments)."""
        try:
            done = subprocess.run(
                ["podman", "--url", self.url, *args],
                input=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if with_stderr else subprocess.PIPE,
                text=True,
                timeout=timeout or settings.CONTAINER_COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except FileNotFoundError as missing:
            raise StepError(
                "podman_missing", "The podman client is not installed on the control plane.", retryable=False
            ) from missing
        except subprocess.TimeoutExpired as slow:
            raise StepError("podman_timeout", f"podman {args[0]} did not answer within {slow.timeout:g} s.") from slow
        if done.returncode != 0:
            stderr = (done.stderr or done.stdout).strip()
            raise podman_unreachable(self.url, args[0], stderr) or PodmanFailed(args[0], stderr)
        return done.stdout

    def containers(self, *labels: str) -> list[dict]:
        """This platform's containers (running or not) carrying every `key` or `key=value` label."""
        filters = [
            argument
            for label in (f"{INSTANCE_LABEL}={settings.CONTAINER_INSTANCE}", *labels)
            for argument in ("--filter", f"label={label}")
        ]
        return json.loads(self.run("ps", "--all", *filters, "--format", "json") or "[]")

    def inspect(self, name: str) -> dict | None:
        try:
            return json.loads(self.run("container", "inspect", name))[0]
        except PodmanFailed as failure:
            if "no such container" in failure.stderr.lower():
                return None
            raise

    def image_digest(self, reference: str) -> str | None:
        try:
            return "sha256:" + self.run("image", "inspect", "--format", "{{.Id}}", reference).strip()
        except PodmanFailed as failure:
            if "image not known" in failure.stderr.lower() or "no such image" in failure.stderr.lower():
                return None
            raise


# --- Images -----------------------------------------------------------------------------------------------


def built_image_tag(reference: str) -> tuple[str, Path]:
    """The tag a `containerfile:<name>` image is built under, and its build context."""
    name = reference.removeprefix(BUILT_PREFIX)
    context = Path(settings.CONTAINER_IMAGE_DIR) / name
    if not CONTEXT_NAME.match(name) or not (context / "Containerfile").is_file():
        raise StepError(
            "image_context_missing",
            f"The image {reference!r} names no Containerfile under {settings.CONTAINER_IMAGE_DIR}.",
            retryable=False,
        )
    return f"localhost/compute-catalog/{name}:{_context_hash(context)[:16]}", context


def _context_hash(context: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(path for path in context.rglob("*") if path.is_file()):
        digest.update(f"{path.relative_to(context).as_posix()}\0{path.stat().st_mode & 0o111}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def image_reference(image: dict) -> str:
    """What podman runs for an approved image."""
    reference = image["reference"]
    return built_image_tag(reference)[0] if reference.startswith(BUILT_PREFIX) else reference


def prepare_built_image(podman: Podman, reference: str) -> dict:
    """Build the image once per content hash (the root filesystem once per cache) and verify the node's image
    against the digest recorded at the first build."""
    tag, context = built_image_tag(reference)
    build_dir = Path(settings.CONTAINER_IMAGE_CACHE).expanduser() / tag.rsplit("/", 1)[1].replace(":", "-")
    manifest = build_dir / "image.json"
    found = podman.image_digest(tag)
    if found and manifest.is_file():
        return _verified(tag, found, json.loads(manifest.read_text())["digest"], built=False)
    with _build_lock(build_dir):
        found = podman.image_digest(tag)  # another worker may have built it while we waited
        recorded = json.loads(manifest.read_text())["digest"] if manifest.is_file() else None
        if found and recorded:
            return _verified(tag, found, recorded, built=False)
        _build(podman, tag, context, build_dir)
        digest = podman.image_digest(tag)
        if recorded is None:
            manifest.write_text(json.dumps({"tag": tag, "digest": digest}))
        return _verified(tag, digest, recorded or digest, built=True)


def _verified(tag: str, found: str, recorded: str, *, built: bool) -> dict:
    if found != recorded:
        raise StepError(
            "image_digest_mismatch",
            f"The node's {tag} is {found}, not the {recorded} it was built as.",
            retryable=False,
            details={"found": found, "recorded": recorded},
        )
    return {"image": tag, "digest": found, "built": built}


@contextmanager
def _build_lock(directory: Path):
    """One build at a time in this directory on this control-plane host: concurrent workers wait for it."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build(podman: Podman, tag: str, context: Path, build_dir: Path) -> None:
    for path in context.iterdir():
        if path.is_file():
            shutil.copy2(path, build_dir / path.name)
    if (context / "rootfs.sh").is_file():
        rootfs = build_dir / "rootfs.tar"
        rootfs.unlink(missing_ok=True)
        os.link(_root_filesystem(context / "rootfs.sh"), rootfs)
    # A fixed timestamp makes the build reproducible: every node builds the image with the same digest.
    podman.run(
        "build", "--timestamp", "0", "--tag", tag, str(build_dir), timeout=settings.CONTAINER_BUILD_TIMEOUT_SECONDS
    )


def _root_filesystem(script: Path) -> Path:
    """The tar the script writes, made once per script content (a change to the rest of the context, such as the
    entry point, rebuilds the image but not its debootstrap'd root filesystem)."""
    rootfs = (
        Path(settings.CONTAINER_IMAGE_CACHE).expanduser()
        / f"rootfs-{hashlib.sha256(script.read_bytes()).hexdigest()[:16]}.tar"
    )
    with _build_lock(rootfs.parent):
        if not rootfs.is_file():
            _run_local(["sh", str(script), str(rootfs)], rootfs.with_suffix(".log"))
    return rootfs


def _run_local(command: list[str], log: Path) -> None:
    """Run a build script ("sh <script> ...") on this host, its output to `log`."""
    with open(log, "w") as output:
        try:
            done = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, timeout=settings.CONTAINER_BUILD_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired as slow:
            raise StepError("image_build_timeout", f"{command[1]} ran for more than {slow.timeout:g} s.") from slow
    if done.returncode != 0:
        tail = log.read_text()[-800:]
        raise StepError("image_build_failed", f"{command[1]} exited with {done.returncode}: {tail}")


def prepare_pulled_image(podman: Podman, reference: str) -> dict:
    digest = podman.image_digest(reference)
    if digest is None:
        podman.run("pull", reference, timeout=settings.CONTAINER_BUILD_TIMEOUT_SECONDS)
        digest = podman.image_digest(reference)
    return {"image": reference, "digest": digest, "built": False}


# --- Workloads --------------------------------------------------------------------------------------------


def _authorized_keys(target: Target) -> str:
    """The key lines the requester's account accepts (drivers.keys). A workspace nobody could log in to is refused
    before it starts."""
    keys = requester_keys(target)
    if not keys:
        raise StepError(
            "ssh_public_key_missing",
            "A workspace needs an SSH public key: the requester has none on their profile and the order gave none.",
            retryable=False,
        )
    return "\n".join(keys)


def container_name(target: Target) -> str:
    return f"{settings.CONTAINER_INSTANCE}-request-{target.request_id}-allocation-{target.allocation_id}"


class ContainerWorkloads(WorkloadDriver):
    """A batch's containers are handled side by side (CONTAINER_BATCH_CONCURRENCY at once): podman's own work
    (build check, create, start, inspect) and the readiness probes wait on the node, one container's independent of
    the next."""

    name = "container"

    def prepare_images(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        return each(self.prepare_image, items, side_by_side=settings.CONTAINER_BATCH_CONCURRENCY)

    def start_workloads(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        return each(self.start_workload, items, side_by_side=settings.CONTAINER_BATCH_CONCURRENCY)

    def workloads_ready(self, items: list[tuple[Target, dict]]) -> list[dict | Exception]:
        return each(self.workload_ready, items, side_by_side=settings.CONTAINER_BATCH_CONCURRENCY)

    def prepare_image(self, target: Target, image: dict) -> dict:
        """The image on every node the work runs on (a gang's members' nodes), the first node's answer returned."""
        reference = image["reference"]
        prepare = prepare_built_image if reference.startswith(BUILT_PREFIX) else prepare_pulled_image
        prepared = [prepare(Podman.of(node), reference) for node in target.nodes]
        return {**prepared[0], "reference": reference}

    def start_workload(self, target: Target, image: dict) -> dict:
        if target.gang:
            return self._start_gang(target, image)
        return self._described(target, self._started(target, image))

    def _started(self, target: Target, image: dict, leader_address: str = "") -> dict | None:
        """The allocation's container, started now or found started (its inspection)."""
        podman = Podman.of(target.node)
        name = container_name(target)
        if not self._run(podman, target, image, leader_address):  # an earlier attempt, or another worker, started it
            existing = podman.inspect(name)
            if existing is not None and existing["State"]["Status"] in ENDED_STATES:
                podman.run("rm", "--force", name)  # what an interrupted attempt left behind
                self._run(podman, target, image, leader_address)
        return podman.inspect(name)

    def _start_gang(self, target: Target, image: dict) -> dict:
        """Every member's container, member 0 first: the others are told its address on the gang's network. All
        started or none: when one cannot start, the ones started are removed and the error is the step's."""
        members = [member_target(target, member) for member in target.gang]
        try:
            leader = self._started(members[0], image)
            address = _network_address(leader) if leader else ""
            containers = [leader, *(self._started(member, image, address) for member in members[1:])]
            described = [
                self._described(member, container) for member, container in zip(members, containers, strict=True)
            ]
        except Exception:
            with suppress(StepError):  # the failure to start is the step's; a retry finds what a failed removal left
                self.stop_workload(target)
            raise
        return {
            **described[0],
            "num_nodes": len(members),
            "members": [
                {"member": member["member"], "node": member["node"], "allocation_id": member["allocation_id"], **shown}
                for member, shown in zip(target.gang, described, strict=True)
            ],
            "rendezvous": {
                **{
                    key: value
                    for key, value in rendezvous_environment(members[0]).items()
                    if not key.startswith("PET_")
                },
                "network": settings.CONTAINER_GANG_NETWORK,
                "leader_address": address,
            },
        }

    def _run(self, podman: Podman, target: Target, image: dict, leader_address: str) -> bool:
        """Start the allocation's container; False when a container of that name exists already."""
        try:
            podman.run("run", "--detach", *self._run_options(target, image, leader_address))
        except PodmanFailed as failure:
            if "already in use" not in failure.stderr:
                raise
            return False
        return True

    def _run_options(self, target: Target, image: dict, leader_address: str) -> list[str]:
        cpu_cores, memory_mib = node_share(target)
        keys = _authorized_keys(target)
        publish = settings.CONTAINER_PUBLISH_IP
        options = [
            *("--name", container_name(target), "--hostname", hostname(target)),
            *self._labels(target),
            *("--cpus", str(cpu_cores), "--memory", f"{memory_mib}m"),
            *("--publish", f"{publish}::{SSH_PORT}"),
            *self._device_options(target),
            *("--env", f"NVIDIA_VISIBLE_DEVICES={','.join(visible_uuid(device) for device in target.devices)}"),
            *(
                "--env",
                f"WORKSPACE_REQUEST={target.request_id}",
                "--env",
                f"WORKSPACE_USER={login_name(target.requester)}",
            ),
            *("--env", f"WORKSPACE_AUTHORIZED_KEY={keys}"),  # one line per key: workspace-start writes them all
        ]
        for variable, value in (image.get("configuration") or {}).get("env", {}).items():
            options += ["--env", f"{variable}={value}"]
        if target.gang:
            options += _gang_options(target, leader_address)
        if _runs_jupyter(target):  # signed in with the token connect_secret_set writes, none before
            options += ["--publish", f"{publish}::{JUPYTER_PORT}", "--env", "WORKSPACE_JUPYTER=1"]
        return [*options, image_reference(image)]

    def _labels(self, target: Target) -> list[str]:
        labels = {
            INSTANCE_LABEL: settings.CONTAINER_INSTANCE,
            REQUEST_LABEL: target.request_id,
            ALLOCATION_LABEL: target.allocation_id,
        }
        return [option for label, value in labels.items() for option in ("--label", f"{label}={value}")]

    def _device_options(self, target: Target) -> list[str]:
        cdi_kind = settings.CONTAINER_CDI_KINDS.get(target.node)
        options = []
        for device in target.devices:
            if cdi_kind:
                options += ["--device", f"{cdi_kind}={device['uuid']}"]
            else:
                host_path = settings.CONTAINER_DEVICE_PATH.format(node=target.node, **device)
                options += ["--device", f"{host_path}:/dev/nvidia{device['index']}"]
        return options

    def _described(self, target: Target, container: dict | None) -> dict:
        if container is None:
            raise StepError("container_missing", f"The container {container_name(target)} is gone.")
        host = settings.CONTAINER_ACCESS_HOST.format(node=target.node)
        ports = _published_ports(container)
        environment = dict(variable.split("=", 1) for variable in container["Config"]["Env"])
        access = {}
        if "jupyter" in ports:  # its token is the requester's (provisioning/connect.py), never in an output
            access["jupyter"] = f"http://{host}:{ports['jupyter']}/"
        return {
            "workload": container["Name"],
            "container_id": container["Id"][:12],
            "host": host,
            "ports": ports,
            "user": environment["WORKSPACE_USER"],
            "devices": [device["uuid"] for device in target.devices],
            "device_nodes": [device["PathInContainer"] for device in container["HostConfig"].get("Devices") or []],
            "image_digest": f"sha256:{container['Image']}",
            "access": access,
        }

    def workload_ready(self, target: Target, started: dict) -> dict:
        """Ready when the container runs and answers (every member's, for a gang: the record lists them as
        start_workload described them)."""
        if not target.gang:
            return self._ready(target)
        ready = [self._ready(member_target(target, member)) for member in target.gang]
        return {**ready[0], "num_nodes": len(ready), "members": started["members"], "rendezvous": started["rendezvous"]}

    def _ready(self, target: Target) -> dict:
        # The container is found by its name (labels carry the ids), so what start_workload reported is not needed.
        podman = Podman.of(target.node)
        container = podman.inspect(container_name(target))
        if container is None:
            raise StepError("container_missing", f"The container {container_name(target)} is gone.", retryable=False)
        state = container["State"]
        if state["Status"] in ENDED_STATES or state.get("Error"):
            raise _exited(podman, container, "before it was ready")
        if not state["Running"]:
            raise StepPending(f"The container is {state['Status']}.", retry_after=PROBE_AGAIN_SECONDS)
        host = settings.CONTAINER_ACCESS_HOST.format(node=target.node)
        ports = _published_ports(container)
        answers = {"ssh": _ssh_banner(host, ports["ssh"])}
        if "jupyter" in ports:
            answers["jupyter"] = _jupyter_version(host, ports["jupyter"])
        silent = [service for service, answer in answers.items() if answer is None]
        if silent:
            raise StepPending(f"Waiting for {' and '.join(silent)} to answer.", retry_after=PROBE_AGAIN_SECONDS)
        return {"ready": True, **answers}

    def connect_secret_names(self, target: Target) -> tuple[str, ...]:
        return ("jupyter",) if _runs_jupyter(target) else ()

    def connect_secret_set(self, target: Target, name: str, value: str) -> None:
        """The workspace's `workspace-secret <name>` reads the value from standard input and replaces the file the
        notebook's sign-in reads (provisioning/images/workspace/). A container that has ended (before or during the
        exec, whose answer is then an error without output) is refused with its exit code, read by `inspect`."""
        podman = Podman.of(target.node)
        try:
            podman.run("exec", "--interactive", container_name(target), "workspace-secret", name, stdin=value)
        except PodmanFailed:
            container = podman.inspect(container_name(target))
            if container is None:
                raise StepError(
                    "container_missing", f"The container {container_name(target)} is gone.", retryable=False
                ) from None
            if container["State"]["Status"] in ENDED_STATES:
                raise _exited(podman, container, f"before it took the new {name} secret") from None
            raise

    def stop_workload(self, target: Target) -> dict:
        """Remove the allocation's container (every member's, for a gang)."""
        removed = []
        for member in _members(target):
            podman = Podman.of(member.node)
            for container in podman.containers(f"{ALLOCATION_LABEL}={member.allocation_id}"):
                podman.run("rm", "--force", "--time", str(STOP_GRACE_SECONDS), container["Id"])
                removed.append(container["Names"][0])
        return {"workload": container_name(target), "removed": removed, "stopped": bool(removed)}

    def ended_workloads(self, targets: Iterable[Target]) -> dict[int, WorkloadEnd]:
        """Of these workspaces, those whose container is no longer running, by allocation id: exit code 0 is a
        release, any other code (or a container removed outside the platform) a failure. A gang has ended when one
        member's container has (by the leader's id): it never runs on some of its nodes only."""
        targets = list(targets)
        containers = {}  # (node, allocation id): the container, read once per node
        for node in {member.node for target in targets for member in _members(target)}:
            for container in Podman.of(node).containers(ALLOCATION_LABEL):
                containers[node, int(container["Labels"][ALLOCATION_LABEL])] = container
        ended = {}
        for target in targets:
            ends = (
                _end_of(member.node, containers.get((member.node, member.allocation_id))) for member in _members(target)
            )
            end = next((end for end in ends if end is not None), None)
            if end is not None:
                ended[target.allocation_id] = end
        return ended


def _runs_jupyter(target: Target) -> bool:
    """Jupyter as ordered, in a gang on member 0 only (the one the record's access opens)."""
    return bool((target.snapshot.get("parameters") or {}).get("jupyter", True)) and _rank(target) == 0


def _members(target: Target) -> list[Target]:
    """The targets of the work's containers: one per member of a gang, else the target itself."""
    return [member_target(target, member) for member in target.gang] or [target]


def _rank(target: Target) -> int:
    """The member's place in its gang (0 leads; work on one node is 0)."""
    return next((member["member"] for member in target.gang if member["allocation_id"] == target.allocation_id), 0)


def hostname(target: Target) -> str:
    return f"request-{target.request_id}" + (f"-node-{_rank(target)}" if target.gang else "")


def _leader_hostname(target: Target) -> str:
    """Member 0's host name: MASTER_ADDR for every member of the gang."""
    return hostname(member_target(target, target.gang[0]))


def rendezvous_environment(target: Target) -> dict[str, str]:
    """What a multi-node launcher needs on each member: member 0's address and port, the node count and this
    node's rank, the GPUs per node and the processes of the whole job (one per GPU). torchrun also reads its options
    from PET_<OPTION> when its command line leaves them out, so `torchrun train.py` needs no flags."""
    nodes, per_node = len(target.gang), len(target.devices)
    port, rank = settings.CONTAINER_RENDEZVOUS_PORT, _rank(target)
    shared = {
        "MASTER_ADDR": _leader_hostname(target),
        "MASTER_PORT": port,
        "NNODES": nodes,
        "NODE_RANK": rank,
        "NPROC_PER_NODE": per_node,
    }
    return {
        **{key: str(value) for key, value in shared.items()},
        "WORLD_SIZE": str(nodes * per_node),
        **{f"PET_{key}": str(value) for key, value in shared.items()},
    }


def _gang_options(target: Target, leader_address: str) -> list[str]:
    """A member on the gang's network with its rendezvous environment; the others resolve member 0's name
    (MASTER_ADDR) to its address there (member 0 resolves its own)."""
    options = ["--network", settings.CONTAINER_GANG_NETWORK]
    if leader_address:
        options += ["--add-host", f"{_leader_hostname(target)}:{leader_address}"]
    for variable, value in rendezvous_environment(target).items():
        options += ["--env", f"{variable}={value}"]
    return options


def _network_address(container: dict) -> str:
    """The container's address on the gang's network."""
    networks = container["NetworkSettings"].get("Networks") or {}
    return networks[settings.CONTAINER_GANG_NETWORK]["IPAddress"]


def _end_of(node: str, container: dict | None) -> WorkloadEnd | None:
    if container is None:
        return WorkloadEnd(
            state="gone",
            failed=True,
            message=f"The workspace container on {node} is gone (removed outside the platform)",
            details={"node": node, "exit_code": None},
        )
    if container["State"] not in ENDED_STATES:
        return None
    code = container["ExitCode"]
    return WorkloadEnd(
        state=container["State"],
        failed=code != 0,
        message=f"The workspace container on {node} exited by itself with code {code}",
        details={"node": node, "exit_code": code, "container": container["Names"][0]},
    )


def _published_ports(container: dict) -> dict[str, int]:
    bindings = container["NetworkSettings"]["Ports"] or {}
    named = {"ssh": f"{SSH_PORT}/tcp", "jupyter": f"{JUPYTER_PORT}/tcp"}
    return {service: int(bindings[port][0]["HostPort"]) for service, port in named.items() if bindings.get(port)}


def _ssh_banner(host: str, port: int) -> str | None:
    """sshd's identification line (RFC 4253), or None while nothing answers with one."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_SECONDS) as connection:
            banner = connection.makefile("rb").readline(256).decode("ascii", "replace").strip()
    except OSError:
        return None
    return banner if banner.startswith("SSH-2.0-") else None


def _jupyter_version(host: str, port: int) -> str | None:
    try:
        answer = httpx.get(f"http://{host}:{port}/api", timeout=PROBE_TIMEOUT_SECONDS)
    except httpx.HTTPError:
        return None
    return answer.json().get("version") if answer.status_code == 200 else None


def _exited(podman: Podman, container: dict, when: str) -> StepError:
    """A container that has ended (or that the runtime could not start), as the step's lasting failure: its exit
    code and the tail of its log."""
    state = container["State"]
    return StepError(
        "container_exited",
        f"The container {state['Status']} with code {state['ExitCode']} {when}"
        + (f": {state['Error']}" if state.get("Error") else "."),
        retryable=False,
        details={"exit_code": state["ExitCode"], "log": _log_tail(podman, container["Name"])},
    )


def _log_tail(podman: Podman, name: str) -> str:
    try:
        return podman.run("logs", "--tail", str(LOG_TAIL_LINES), name, with_stderr=True)[-2000:]
    except StepError:
        return ""
