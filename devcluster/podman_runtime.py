"""A real container runtime for the container backend's tests: rootful podman with runc, explicit ulimits in its own
containers.conf (crun, and runc with podman's default rlimits, fail here without CAP_SYS_RESOURCE, so the limits
stay under this machine's hard ones; CONTAINERS_CONF
keeps the machine's global configuration untouched), serving its REST socket through `podman system service`, and
fake GPU device nodes (`mknod c 1 3`, the same numbers as /dev/null). Started once a session, stopped by PID."""

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
"""
DEVICES = 4
NEEDED = ("podman", "runc", "debootstrap", "ssh", "ssh-keygen")


class PodmanMissing(RuntimeError):
    pass


@contextlib.contextmanager
def running_podman(root: Path, *, nodes: dict[str, int], instance: str) -> Iterator[SimpleNamespace]:
    """podman's service on a socket under `root`, fake device nodes for each node's cards (`<root>/dev/<node>/
    nvidia<index>`), and a client key pair: {url, device_path, key, instance}. The instance's containers are
    removed and the service stopped (by PID) at the end."""
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        raise PodmanMissing(f"The container backend needs {', '.join(missing)}: run `make podman`.")
    (root / "containers.conf").write_text(CONTAINERS_CONF)
    url = f"unix://{root / 'podman.sock'}"
    with open(root / "service.log", "w") as log:
        service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", url],
            env={**os.environ, "CONTAINERS_CONF": str(root / "containers.conf")},
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    try:
        _wait_until_answering(url, service, root)
        for node, cards in nodes.items():
            _fake_devices(root / "dev" / node, cards)
        yield SimpleNamespace(
            url=url,
            device_path=str(root / "dev" / "{node}" / "nvidia{index}"),
            key=_key_pair(root / "id_ed25519"),
            instance=instance,
        )
        _remove_containers(url, instance)
    finally:
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=30)


def _wait_until_answering(url: str, service: subprocess.Popen, root: Path) -> None:
    deadline = time.monotonic() + 30
    while subprocess.run(["podman", "--url", url, "version"], capture_output=True, check=False).returncode != 0:
        if service.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"podman system service did not start: {(root / 'service.log').read_text()[-2000:]}")
        time.sleep(0.2)


def _fake_devices(directory: Path, cards: int) -> None:
    directory.mkdir(parents=True)
    for index in range(cards):
        os.mknod(directory / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _key_pair(path) -> SimpleNamespace:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return SimpleNamespace(private=str(path), public=path.with_suffix(".pub").read_text().strip())


def _remove_containers(url: str, instance: str) -> None:
    listed = subprocess.run(
        [
            "podman",
            "--url",
            url,
            "ps",
            "--all",
            "--filter",
            f"label=compute-catalog.instance={instance}",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    ids = [container["Id"] for container in json.loads(listed.stdout or "[]")]
    if ids:
        subprocess.run(["podman", "--url", url, "rm", "--force", "--time", "0", *ids], capture_output=True, check=True)


def ssh(runtime, access: dict, command: str) -> subprocess.CompletedProcess:
    """Run a command over the workspace's published SSH port as the account the record names."""
    user_at_host = access["ssh"].split()[-1]
    port = access["ssh"].split()[2]
    return subprocess.run(
        [
            "ssh",
            *("-i", runtime.key.private, "-p", port),
            *("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"),
            *("-o", "ConnectTimeout=10"),
            user_at_host,
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
