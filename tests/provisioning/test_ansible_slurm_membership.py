"""A tenant's bare-metal server never holds the shared cluster's munge key while its tenant has root. The `ansible`
in-band driver on real hosts (podman containers from the bare-metal host image) and the session's real Slurm cluster,
one test per membership the profile declares:

- shared_cluster_no_root: the shared cluster's key on the host, the node idle in the shared cluster, the tenant's
  account with their key and no root (checked by the playbook after granting, and again by the health check);
- tenant_cluster: a key made on the host, never the shared one (replaced when found there), the server's own
  slurmctld with the node idle in it and absent from the shared cluster, the tenant root through sudo;
- none: no munge key and no Slurm at all, the tenant root.

The tenant's access is exercised as the tenant would: `ssh` with the order's key, then `sudo`.
"""

import hashlib
import subprocess
from pathlib import Path

import pytest

from provisioning.drivers.ansible import AnsibleHost, clear_control_sockets
from provisioning.drivers.base import StepError
from tests.provisioning.test_ansible_driver import DRIVER_VERSION, target_for

USER = "dev_one"  # the login name of target_for's requester, Dev.One
KEY = "/etc/munge/munge.key"


@pytest.fixture
def tenant_key(tmp_path) -> tuple[Path, str]:
    """The requester's SSH key pair: (private key file, public key line for the order)."""
    private = tmp_path / "tenant_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(private)], check=True)
    return private, private.with_suffix(".pub").read_text().strip()


@pytest.fixture
def driver() -> AnsibleHost:
    return AnsibleHost(timeout=300)


def installed(driver: AnsibleHost, target) -> None:
    """The steps before the cluster's: the health check asks the driver and the agent too."""
    driver.install_gpu_driver(target, DRIVER_VERSION)
    driver.install_monitoring_agent(target, "node-exporter")


def as_tenant(host, key: Path, command: str) -> subprocess.CompletedProcess:
    """`command` run over SSH as the tenant, with the order's key: what the tenant can do."""
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", f"{USER}@{host.address}", command],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def key_on(hosts, host) -> str | None:
    """SHA-256 of the host's munge key, None when it has none."""
    found = hosts.exec(host, "sha256sum", KEY)
    return found.stdout.split()[0] if found.returncode == 0 else None


def shared_key(settings) -> str:
    return hashlib.sha256(Path(settings.INBAND_MUNGE_KEY_FILE).read_bytes()).hexdigest()


def test_a_shared_cluster_server_holds_the_clusters_key_and_its_tenant_has_no_root(
    in_band, slurm, settings, driver, tenant_key
):
    host = in_band.hosts.start("bm-shared", cards=2)
    private, public = tenant_key
    target = target_for(host, slurm.name, ssh_public_key=public, slurm_membership="shared_cluster_no_root")
    installed(driver, target)

    registered = driver.register_in_cluster(target, slurm.name)
    access = driver.grant_access(target, ssh_public_keys=[public], root=False)
    health = driver.health_check(target, [])

    assert (registered["slurm_membership"], registered["cluster"]) == ("shared_cluster_no_root", slurm.name)
    assert registered["munge_key"] == "the shared cluster's" and key_on(in_band.hosts, host) == shared_key(settings)
    assert slurm.node_states()["bm-shared"] == "idle"
    assert (access["user"], access["ssh_keys"], access["root"]) == (USER, 1, False)
    assert health["checks"]["tenant_root"] == "passed (none: no sudo rule, no privileged group)"
    # The tenant logs in with their key, and gets no further.
    assert as_tenant(host, private, "id -un").stdout.strip() == USER
    assert as_tenant(host, private, "sudo -n true").returncode != 0
    assert as_tenant(host, private, f"cat {KEY}").returncode != 0
    assert as_tenant(host, private, "su -c true root </dev/null").returncode != 0

    # Root that appears on the server after install (here: the account put in the sudo group) fails the health
    # check for good, naming what it found; granting the access again takes it away.
    in_band.hosts.exec(host, "sh", "-c", f"getent group sudo || groupadd sudo; usermod -aG sudo {USER}")
    with pytest.raises(StepError) as failure:
        driver.health_check(target, [])
    assert (failure.value.code, failure.value.retryable) == ("playbook_task_failed", False)
    assert f"task 'Check the tenant is in no group that grants root' failed: {USER} is in group sudo" in (
        failure.value.message
    )
    assert driver.grant_access(target, ssh_public_keys=[public], root=False)["ansible"]["changed"] > 0
    assert driver.health_check(target, [])["checks"]["tenant_root"].startswith("passed")

    released = driver.deregister_from_cluster(target, slurm.name)
    assert released["removed_now"] is True and "bm-shared" not in slurm.node_states()


def test_a_sudo_rule_for_the_tenant_on_a_shared_cluster_server_is_found(in_band, slurm, driver, tenant_key):
    host = in_band.hosts.start("bm-sudoer", cards=1)
    private, public = tenant_key
    target = target_for(host, slurm.name, cards=1, ssh_public_key=public)  # a snapshot from before: shared
    installed(driver, target)
    driver.register_in_cluster(target, slurm.name)
    driver.grant_access(target, ssh_public_keys=[public], root=False)
    rule = f"{USER} ALL=(ALL) NOPASSWD: ALL"
    in_band.hosts.exec(host, "sh", "-c", f"apt-get install -y -q sudo && echo '{rule}' > /etc/sudoers.d/x")
    assert as_tenant(host, private, "sudo -n id -u").stdout.strip() == "0"  # a real hole

    with pytest.raises(StepError) as failure:
        driver.health_check(target, [])

    assert "task 'Check no sudo rule lets the tenant run anything' failed" in failure.value.message
    assert not failure.value.retryable
    driver.deregister_from_cluster(target, slurm.name)


def test_a_tenant_cluster_server_runs_its_own_cluster_with_a_key_of_its_own_and_its_tenant_is_root(
    in_band, slurm, settings, driver, tenant_key
):
    host = in_band.hosts.start("bm-own", cards=2)
    private, public = tenant_key
    target = target_for(host, "", ssh_public_key=public, slurm_membership="tenant_cluster")
    # As if a server had come back with the shared key on it: the tenant must not keep it.
    in_band.hosts.exec(host, "sh", "-c", f"mkdir -p /etc/munge && cat > {KEY}")
    subprocess.run(
        ["podman", "--url", in_band.hosts.runtime.url, "cp", settings.INBAND_MUNGE_KEY_FILE, f"{host.container}:{KEY}"],
        check=True,
    )
    assert key_on(in_band.hosts, host) == shared_key(settings)
    installed(driver, target)

    registered = driver.register_in_cluster(target, "")
    access = driver.grant_access(target, ssh_public_keys=[public], root=True)
    health = driver.health_check(target, [])

    assert registered["slurm_membership"] == "tenant_cluster"
    assert (registered["cluster"], registered["slurm_state"], registered["munge_key"]) == (
        "ml-research-bm-own",
        "idle",
        "the server's own",
    )
    own_key = key_on(in_band.hosts, host)
    assert own_key not in (None, shared_key(settings))
    owner = in_band.hosts.exec(host, "stat", "-c", "%U %a %s", KEY).stdout.split()
    assert owner == ["munge", "400", "1024"]
    # The node is in its own cluster, not in the shared one.
    assert in_band.hosts.exec(host, "scontrol", "show", "config").stdout.count("ml-research-bm-own") >= 1
    assert "bm-own" not in slurm.node_states()
    assert access["root"] is True and health["checks"]["tenant_root"] == "granted (sudo)"
    assert health["checks"]["cluster_node_idle"] == "passed (idle in its own cluster)"
    # The tenant is root, and their cluster runs their jobs.
    assert as_tenant(host, private, "sudo -n id -u").stdout.strip() == "0"
    assert as_tenant(host, private, "srun --nodes=1 --gres=gpu:2 hostname").stdout.strip() == "bm-own"

    rerun = [
        driver.register_in_cluster(target, ""),
        driver.grant_access(target, ssh_public_keys=[public], root=True),
        driver.health_check(target, []),
    ]
    assert [step["ansible"]["changed"] for step in rerun] == [0, 0, 0], [step["ansible"]["log"] for step in rerun]
    assert key_on(in_band.hosts, host) == own_key

    released = driver.deregister_from_cluster(target, "")
    assert (released["cluster"], released["deregistered"]) == ("ml-research-bm-own", True)
    assert key_on(in_band.hosts, host) is None
    assert in_band.hosts.exec(host, "start-stop-daemon", "--status", "--pidfile", "/run/slurmctld.pid").returncode


def test_a_server_without_slurm_gets_no_munge_key_and_its_tenant_is_root(in_band, slurm, driver, tenant_key):
    host = in_band.hosts.start("bm-none", cards=1)
    private, public = tenant_key
    target = target_for(host, "", cards=1, ssh_public_key=public, slurm_membership="none")
    installed(driver, target)

    registered = driver.register_in_cluster(target, "")
    driver.grant_access(target, ssh_public_keys=[public], root=True)
    health = driver.health_check(target, [])

    assert registered == {"slurm_membership": "none", "cluster": None, "registered": False}
    assert key_on(in_band.hosts, host) is None
    assert in_band.hosts.exec(host, "sh", "-c", "command -v munged slurmd").returncode != 0
    assert "bm-none" not in slurm.node_states()
    assert health["checks"]["cluster_node_idle"] == "not in a cluster (the profile joins none)"
    assert as_tenant(host, private, "sudo -n id -u").stdout.strip() == "0"
    assert driver.deregister_from_cluster(target, "")["deregistered"] is True

    # Root can lock the platform out; the release goes on (power-off and reinstall follow), the node stays usable.
    assert as_tenant(host, private, "sudo -n sh -c ': > /root/.ssh/authorized_keys'").returncode == 0
    clear_control_sockets()
    locked_out = driver.deregister_from_cluster(target, "")
    assert locked_out["deregistered"] is False and "unreachable over SSH" in locked_out["skipped"]


def test_an_order_key_that_is_not_one_public_key_line_is_refused_before_the_host_is_touched(in_band, slurm, driver):
    host = in_band.hosts.start("bm-badkey", cards=1)
    target = target_for(host, slurm.name, cards=1)

    with pytest.raises(StepError) as failure:
        driver.grant_access(target, ssh_public_keys=["ssh-ed25519 AAAA\ncommand=/bin/sh ssh-rsa AAAA"], root=False)

    assert (failure.value.code, failure.value.retryable) == ("ssh_public_key_invalid", False)
    assert in_band.hosts.exec(host, "id", USER).returncode != 0
