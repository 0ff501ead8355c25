"""`python -m bench in_band [--hosts N] [--json]`: the `ansible` in-band driver's steps timed on real test hosts.

Starts what the tests use (tests/): a one-node Slurm cluster, this machine's rootful podman with the bare-metal host
image (built or found in the cache before the clock starts: debootstrap is not measured) and N fresh hosts with 8
fake GPUs each; then, host by host, every in-band step of the bare-metal pipeline (install_gpu_driver,
install_monitoring_agent, register_cluster with `slurmd -Z` confirmed idle through slurmrestd, health_check) run
for the first time, then again on the same host (the idempotent rerun a resumed step does, changed=0 asserted),
then the release's deregister_cluster. Prints one row per step: median seconds of the first run and of the rerun.
"""

import json
import statistics
import tempfile
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings

DRIVER_VERSION = "550.54.15"
CARDS = 8
STEPS = ("install_gpu_driver", "install_monitoring_agent", "register_cluster", "grant_access", "health_check")


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=2)
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, hosts, as_json, **options):
        from devcluster.ansible_hosts import TestHosts, build_driver_package
        from devcluster.podman_runtime import running_podman
        from devcluster.slurm_cluster import running_cluster

        with (
            tempfile.TemporaryDirectory(prefix="bench-in-band-") as root,
            running_cluster(node_count=1, name_prefix="bench") as cluster,
            running_podman(Path(root), nodes={}, instance=f"cc-bench-in-band-{time.time_ns()}") as podman,
        ):
            root = Path(root)
            (root / "packages").mkdir()
            build_driver_package(root / "packages", DRIVER_VERSION)
            test_hosts = TestHosts(podman, root)
            try:
                with override_settings(
                    SSH_CREDENTIALS={"bench": {"username": "root", "private_key_file": podman.key.private}},
                    ANSIBLE_STATE_DIR=str(root / "ansible"),
                    INBAND_PACKAGE_DIR=str(root / "packages"),
                    INBAND_MUNGE_KEY_FILE=str(cluster.root / "munge" / "munge.key"),
                    INBAND_SLURMCTLD_ADDRESS=test_hosts.gateway,
                    SLURM_REST_URL=cluster.rest_url,
                    SLURM_USER_NAME=cluster.user_name,
                    SLURM_JWT=cluster.token,
                    SLURM_JWT_FILE="",
                    SLURM_CONF=str(cluster.slurm_conf),
                ):
                    timings = [self._one_host(test_hosts, cluster, number) for number in range(1, hosts + 1)]
            finally:
                test_hosts.remove_all()
        rows = [
            {
                "step": step,
                "first_s": round(statistics.median(t[step][0] for t in timings), 2),
                "rerun_s": round(statistics.median(t[step][1] for t in timings), 2),
                "rerun_changed": max(t[step][2] for t in timings),
            }
            for step in [*STEPS, "all in-band steps", "deregister_cluster"]
        ]
        for row in rows:
            self.stdout.write(json.dumps(row) if as_json else str(row))

    def _one_host(self, test_hosts, cluster, number: int) -> dict:
        from provisioning.drivers.ansible import AnsibleHost
        from provisioning.drivers.base import StepPending, Target

        host = test_hosts.start(f"bench-bm{number}", CARDS)
        target = Target(
            run_id=number,
            request_id=number,
            node=host.name,
            devices=tuple({"index": index, "uuid": f"GPU-{host.name}-{index}"} for index in range(CARDS)),
            snapshot={
                "bare_metal_profile": {
                    "driver_version": DRIVER_VERSION,
                    "monitoring_agent": "node-exporter",
                    "target_cluster": cluster.name,
                    "accelerator_model": "h100-80gb",
                    "playbooks": "bare-metal-v1",
                }
            },
            os_address=host.address,
            ssh_credentials_ref="bench",
            requester="bench",
        )
        driver = AnsibleHost(timeout=600)
        calls = {
            "install_gpu_driver": lambda: driver.install_gpu_driver(target, DRIVER_VERSION),
            "install_monitoring_agent": lambda: driver.install_monitoring_agent(target, "node-exporter"),
            "register_cluster": lambda: driver.register_in_cluster(target, cluster.name),
            "grant_access": lambda: driver.grant_access(target, ssh_public_keys=[], root=False),
            "health_check": lambda: driver.health_check(target, []),
            "deregister_cluster": lambda: driver.deregister_from_cluster(target, cluster.name),
        }

        def timed(step):
            started = time.monotonic()
            while True:
                try:
                    output = calls[step]()
                    return time.monotonic() - started, output["ansible"]["changed"]
                except StepPending as pending:  # what the engine does: ask again
                    time.sleep(pending.retry_after)

        first = {step: timed(step) for step in STEPS}
        rerun = {step: timed(step) for step in STEPS}
        changed = {step: changed for step, (_, changed) in rerun.items()}
        if any(changed.values()):
            raise CommandError(f"The rerun on {host.name} changed something: {changed}")
        result = {step: (first[step][0], rerun[step][0], changed[step]) for step in STEPS}
        result["all in-band steps"] = (
            sum(first[step][0] for step in STEPS),
            sum(rerun[step][0] for step in STEPS),
            sum(changed.values()),
        )
        seconds, _ = timed("deregister_cluster")
        result["deregister_cluster"] = (seconds, timed("deregister_cluster")[0], 0)
        test_hosts.remove(host)
        return result
