"""The pytest side of devcluster/ (the local daemons the tests, `make run-slurm`, `make run-sso` and the benchmarks
share): fixtures, and a part that is missing or does not come up failing the test (never a skip)."""

import contextlib
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from devcluster.ansible_hosts import TestHosts, build_driver_package
from devcluster.podman_runtime import DEVICES, PodmanMissing, running_podman
from devcluster.slurm_cluster import SlurmCluster, SlurmClusterError, running_cluster


@contextlib.contextmanager
def cluster_for_tests(**options) -> Iterator[SlurmCluster]:
    """running_cluster for a pytest fixture: a part that is missing or does not come up fails the test (never a
    skip), with what is missing and the daemons' logs."""
    try:
        with running_cluster(**options) as cluster:
            yield cluster
    except SlurmClusterError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def podman_service(tmp_path_factory):
    """This machine's podman as the container backend reaches a node's (nodes "podman-1" and "podman-2", the second
    for multi-node gangs, 4 cards each)."""
    try:
        with running_podman(
            tmp_path_factory.mktemp("podman"),
            nodes={"podman-1": DEVICES, "podman-2": DEVICES},
            instance=f"cc-test-{os.getpid()}",
        ) as runtime:
            yield runtime
    except PodmanMissing as missing:
        pytest.fail(str(missing))


@pytest.fixture(scope="session")
def test_hosts(podman_service, tmp_path_factory):
    """The session's bare-metal test hosts (start them with test_hosts.start(name, cards)); all removed at the end."""
    hosts = TestHosts(podman_service, tmp_path_factory.mktemp("test-hosts"))
    yield hosts
    hosts.remove_all()


@pytest.fixture
def in_band(settings, test_hosts, slurm_settings, tmp_path):
    """Settings for the `ansible` in-band driver on the test hosts and the session's Slurm cluster: the test key by
    reference, a fresh known_hosts directory, the stand-in driver package, the cluster's munge key and controller
    (reached from the hosts at the bridge's gateway). Hosts a test started are removed after it."""
    state = tmp_path / "ansible-state"
    packages = tmp_path / "packages"
    packages.mkdir()
    build_driver_package(packages, "550.54.15")
    settings.PROVISIONING_IN_BAND_DRIVER = "ansible"
    settings.SSH_CREDENTIALS = {"test-hosts": {"username": "root", "private_key_file": test_hosts.runtime.key.private}}
    settings.ANSIBLE_STATE_DIR = str(state)
    settings.INBAND_PACKAGE_DIR = str(packages)
    settings.INBAND_MUNGE_KEY_FILE = str(slurm_settings.root / "munge" / "munge.key")
    settings.INBAND_SLURMCTLD_ADDRESS = test_hosts.gateway
    started = len(test_hosts.ids)
    yield SimpleNamespace(hosts=test_hosts, state=state, packages=packages, cluster=slurm_settings)
    for container in test_hosts.ids[started:]:
        test_hosts.remove(SimpleNamespace(container=container))
