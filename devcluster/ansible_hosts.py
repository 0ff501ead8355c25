"""Real hosts for the Ansible in-band driver's tests: podman containers (rootful, runc: tests/provisioning/
podman_runtime.py) from the locally built bare-metal host image (provisioning/images/baremetal-host: Debian 12 by
debootstrap with OpenSSH, Python and the site's package mirror; built once per content hash, cached). Each host has
podman's own network namespace (the default bridge network, its own address), fake GPU device nodes, and accepts
the test key as root. Started by a session fixture, removed by container id at the end.

Also the stand-in GPU driver package (no NVIDIA driver installs here): a .deb built with dpkg-deb that installs an
`nvidia-smi` which reports its version and the /dev/nvidia* nodes it finds.
"""

import contextlib
import json
import os
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from provisioning.drivers.container import Podman, prepare_built_image

HOST_IMAGE = "containerfile:baremetal-host"
HOST_LABEL = "compute-catalog.test-host"
STAND_IN_NVIDIA_SMI = """#!/bin/sh
# Stand-in for NVIDIA's nvidia-smi (compute-catalog tests): the package's version once per GPU device node found.
for device in /dev/nvidia[0-9]*; do
    [ -e "$device" ] || exit 6
    echo "{version}"
done
"""


def build_driver_package(directory: Path, version: str) -> Path:
    """cc-gpu-driver_<version>_all.deb, built with dpkg-deb (once per version and directory)."""
    package = directory / f"cc-gpu-driver_{version}_all.deb"
    if package.exists():
        return package
    tree = directory / f"tree-{version}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: cc-gpu-driver\nVersion: {version}\nArchitecture: all\nMaintainer: Compute Catalog tests\n"
        "Description: Stand-in GPU driver for the in-band driver tests\n"
    )
    (tree / "usr" / "bin").mkdir(parents=True)
    smi = tree / "usr" / "bin" / "nvidia-smi"
    smi.write_text(STAND_IN_NVIDIA_SMI.format(version=version))
    smi.chmod(0o755)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(package)], check=True,
                   capture_output=True)  # fmt: skip
    return package


class TestHosts:
    """Starts and removes the bare-metal test hosts on one podman service."""

    def __init__(self, runtime, root: Path):
        self.podman = Podman(runtime.url)
        self.runtime = runtime
        self.root = root
        self.image = prepare_built_image(self.podman, HOST_IMAGE)["image"]
        network = json.loads(self.podman.run("network", "inspect", "podman"))[0]
        # Where the hosts reach this machine (slurmctld, for one): the bridge's gateway.
        self.gateway = network["subnets"][0]["gateway"]
        self.ids: list[str] = []

    def start(self, name: str, cards: int) -> SimpleNamespace:
        """A fresh host named `name` (its hostname) with `cards` fake GPUs at /dev/nvidia<i>; its address."""
        devices = self.root / "dev" / name
        devices.mkdir(parents=True, exist_ok=True)
        arguments = []
        for index in range(cards):
            node = devices / f"nvidia{index}"
            if not node.exists():
                os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            arguments += ["--device", f"{node}:/dev/nvidia{index}"]
        container = self.podman.run(
            "run", "--detach", "--name", f"{self.runtime.instance}-{name}", "--hostname", name,
            "--label", f"compute-catalog.instance={self.runtime.instance}", "--label", f"{HOST_LABEL}={name}",
            "--env", f"HOST_AUTHORIZED_KEY={self.runtime.key.public}", *arguments, self.image,
        ).strip()  # fmt: skip
        self.ids.append(container)
        address = json.loads(self.podman.run("inspect", container))[0]["NetworkSettings"]["IPAddress"]
        host = SimpleNamespace(name=name, container=container, address=address)
        self._wait_for_ssh(host)
        return host

    def remove(self, host) -> None:
        with contextlib.suppress(Exception):
            self.podman.run("rm", "--force", "--time", "0", host.container)
        if host.container in self.ids:
            self.ids.remove(host.container)

    def restart(self, host) -> None:
        """Restart the host's container (sshd picks up a new host key); it keeps its address."""
        self.podman.run("restart", "--time", "0", host.container)
        host.address = json.loads(self.podman.run("inspect", host.container))[0]["NetworkSettings"]["IPAddress"]
        self._wait_for_ssh(host)

    def exec(self, host, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["podman", "--url", self.runtime.url, "exec", host.container, *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def remove_all(self) -> None:
        if self.ids:
            subprocess.run(["podman", "--url", self.runtime.url, "rm", "--force", "--time", "0", *self.ids],
                           capture_output=True, check=False)  # fmt: skip
        self.ids.clear()

    def _wait_for_ssh(self, host, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while True:
            probe = subprocess.run(
                ["ssh", "-i", self.runtime.key.private, "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                 "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", f"root@{host.address}",
                 "true"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                logs = self.podman.run("logs", host.container, with_stderr=True)
                raise AssertionError(f"{host.name} ({host.address}) answers no SSH: {probe.stderr}\n{logs[-2000:]}")
            time.sleep(0.3)
