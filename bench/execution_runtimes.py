"""The runtimes `python -m bench execution` measures on, one context manager per backend (BACKENDS) that starts it
and yields a Runtime: the nodes to put into the inventory and the settings that point the platform at it.

`slurm`: the local Slurm cluster of devcluster/slurm_cluster.py, tuned for interactive starts.
`container`: this machine's podman (runc, the tests' containers.conf) as two nodes' container runtime, with fake device
nodes for their cards and the workspace image built (or found in the cache) and verified before the clock starts, so
the benchmark measures ordering a workspace, not debootstrap."""

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.core.management.base import CommandError
from django.test.utils import override_settings

from provisioning.drivers.container import Podman, prepare_built_image
from scheduling.choices import ExecutionBackend
from scheduling.slurm.api import SlurmApi

NODES = 2
WORKSPACE_IMAGE = "containerfile:workspace"


@contextlib.contextmanager
def container_runtime(requests: int) -> Iterator:
    """Room for every request at once: 1 card, 1 CPU and 1 GiB each, over NODES nodes."""
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


@dataclass(frozen=True)
class BenchNode:
    name: str
    cpus: int
    memory_mib: int
    gpu_type: str
    gpus: int


@dataclass(frozen=True)
class Runtime:
    """A running backend: the nodes to put into the inventory, and the settings that point the platform at it."""

    backend: str
    nodes: list[BenchNode]
    settings: dict[str, str]
    image_reference: str = "bench"  # what the backend runs (the container backend builds "containerfile:...")
    parameters: dict = field(default_factory=dict)  # the orders' parameters (a workspace's SSH key)
    daemon_groups: Callable[[], dict[str, int]] = dict  # the backend's own daemons' process groups, to meter


@contextlib.contextmanager
def slurm_runtime(requests: int) -> Iterator[Runtime]:
    """The local Slurm test cluster: eight-GPU nodes (as most GPU servers are), enough of them for all the requests at
    once (1 GPU, 1 CPU, 1 GiB each)."""
    from devcluster.slurm_cluster import NodeShape, running_cluster

    gpus = SLURM_NODE_GPUS
    node_count = math.ceil(requests / gpus)
    shape = NodeShape(cpus=2 * gpus, real_memory_mib=2048 * gpus, gpus=gpus)
    with running_cluster(node_count=node_count, node_shape=shape, name_prefix="bench") as cluster:
        tune_scheduler(cluster)
        yield Runtime(
            backend=ExecutionBackend.SLURM,
            nodes=[
                BenchNode(name, shape.cpus, shape.real_memory_mib, shape.gpu_type, gpus) for name in cluster.node_names
            ],
            settings=slurm_settings(cluster),
            daemon_groups=lambda: cluster.daemon_groups,
        )


SLURM_NODE_GPUS = 8


def slurm_settings(cluster) -> dict:
    """The settings that point the platform at a running test cluster (devcluster.slurm_cluster.SlurmCluster)."""
    return {
        "SLURM_REST_URL": cluster.rest_url,
        "SLURM_USER_NAME": cluster.user_name,
        "SLURM_JWT": cluster.token,
        "SLURM_JWT_FILE": "",
        "SLURM_CONF": str(cluster.slurm_conf),
        "SLURM_PARTITION": cluster.partition,
        "SLURM_JOB_DIRECTORY": str(cluster.job_dir),
    }


# Slurm's defaults start a batch job submitted while others run only on a later scheduling pass, about 2.7 s after
# submission here; a site that wants interactive starts tunes this, and so does the benchmark's cluster.
SLURM_SCHEDULER_PARAMETERS = "sched_min_interval=100000,batch_sched_delay=0"
WARM_UP_SECONDS = 30


def tune_scheduler(cluster, parameters: str = SLURM_SCHEDULER_PARAMETERS) -> None:
    """The tuning above (or `parameters`, Slurm's SchedulerParameters), then one job through the cluster: the first
    scheduling pass after a reconfiguration comes about 2 s late (measured: 25 jobs RUNNING 2.1-2.6 s after
    submission, the next 25 within 0.5-0.8 s), which a cluster in service is long past."""
    with cluster.slurm_conf.open("a") as conf:
        conf.write(f"SchedulerParameters={parameters}\n")
    cluster.scontrol("reconfigure")
    with SlurmApi(url=cluster.rest_url, user_name=cluster.user_name, token=cluster.token) as api:
        job_id = api.submit_job(
            "#!/bin/sh\nexec sleep infinity\n",
            {
                "name": "bench-warm-up",
                "nodes": "1",
                "cpus_per_task": 1,
                "memory_per_node": 64,
                "time_limit": 1,
                "current_working_directory": str(cluster.job_dir),
                "environment": {"PATH": "/usr/bin:/bin"},
            },
        )["job_id"]
        deadline = time.monotonic() + WARM_UP_SECONDS
        while api.job(job_id)["job_state"] != "RUNNING":
            if time.monotonic() > deadline:
                raise CommandError(f"Slurm did not start the warm-up job within {WARM_UP_SECONDS} s.")
            time.sleep(0.1)
        api.cancel_job(job_id)


BACKENDS: dict[str, Callable[[int], contextlib.AbstractContextManager[Runtime]]] = {
    ExecutionBackend.SLURM: slurm_runtime,
    ExecutionBackend.CONTAINER: container_runtime,
}
