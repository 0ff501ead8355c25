"""bench_execution's `container` backend: this machine's podman (runc, the tests' containers.conf) as two nodes'
container runtime, with fake device nodes for their cards and the workspace image built (or found in the cache)
and verified before the clock starts, so the benchmark measures ordering a workspace, not debootstrap."""

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from django.test.utils import override_settings

from provisioning.drivers.container import Podman, prepare_built_image
from scheduling.choices import ExecutionBackend

NODES = 2
WORKSPACE_IMAGE = "containerfile:workspace"


@contextlib.contextmanager
def container_runtime(requests: int) -> Iterator:
    """Room for every request at once: 1 card, 1 CPU and 1 GiB each, over NODES nodes."""
    from bench.execution import BenchNode, Runtime
    from devcluster.podman_runtime import running_podman

    cards = math.ceil(requests / NODES)
    names = [f"bench-podman-{number}" for number in range(1, NODES + 1)]
    with (
        tempfile.TemporaryDirectory(prefix="bench-podman-") as root,
        running_podman(Path(root), nodes=dict.fromkeys(names, cards), instance=f"cc-bench-{os.getpid()}") as podman,
    ):
        runtime_settings = {
            "CONTAINER_PODMAN_URL": podman.url,
            "CONTAINER_ACCESS_HOST": "127.0.0.1",
            "CONTAINER_PUBLISH_IP": "127.0.0.1",
            "CONTAINER_DEVICE_PATH": podman.device_path,
            "CONTAINER_INSTANCE": podman.instance,
        }
        with override_settings(**runtime_settings):
            prepare_built_image(Podman(podman.url), WORKSPACE_IMAGE)
        yield Runtime(
            backend=ExecutionBackend.CONTAINER,
            nodes=[BenchNode(name, 2 * cards, 2048 * cards, "bench-gpu", cards) for name in names],
            settings=runtime_settings,
            image_reference=WORKSPACE_IMAGE,
            parameters={"ssh_public_key": podman.key.public, "jupyter": False},
        )
