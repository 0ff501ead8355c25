"""A real container runtime for the container backend's tests: rootful podman with runc, explicit ulimits in its own
containers.conf (crun, and runc with podman's default rlimits, fail here without CAP_SYS_RESOURCE, so the limits
stay under this machine's hard ones; CONTAINERS_CONF
keeps the machine's global configuration untouched), serving its REST socket through `podman system service`, and
fake GPU device nodes (`mknod c 1 3`, the same numbers as /dev/null). Started once a session, stopped by PID."""

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from types import SimpleNamespace

import pytest

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
"""
DEVICES = 4
NEEDED = ("podman", "runc", "debootstrap", "ssh", "ssh-keygen")


@pytest.fixture(scope="session")
def podman_service(tmp_path_factory):
    """The node's podman as the container backend reaches it: {url, device_path, key, instance}."""
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"The container backend's tests need {', '.join(missing)}: run `make podman`.")
    root = tmp_path_factory.mktemp("podman")
    (root / "containers.conf").write_text(CONTAINERS_CONF)
    socket_path = root / "podman.sock"
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket_path}"],
        env={**os.environ, "CONTAINERS_CONF": str(root / "containers.conf")},
        stdout=subprocess.DEVNULL,
        stderr=open(root / "service.log", "w"),  # noqa: SIM115  (the service writes to it until the end)
        start_new_session=True,
    )
    url = f"unix://{socket_path}"
    try:
        _wait_until_answering(url, service, root)
        runtime = SimpleNamespace(
            url=url,
            device_path=str(_fake_devices(root / "dev") / "nvidia{index}"),
            key=_key_pair(root / "id_ed25519"),
            instance=f"cc-test-{os.getpid()}",
        )
        yield runtime
        _remove_containers(url, runtime.instance)
    finally:
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=30)


def _wait_until_answering(url: str, service: subprocess.Popen, root) -> None:
    deadline = time.monotonic() + 30
    while subprocess.run(["podman", "--url", url, "version"], capture_output=True, check=False).returncode != 0:
        if service.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"podman system service did not start: {(root / 'service.log').read_text()[-2000:]}")
        time.sleep(0.2)


def _fake_devices(directory):
    directory.mkdir()
    for index in range(DEVICES):
        os.mknod(directory / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return directory


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
