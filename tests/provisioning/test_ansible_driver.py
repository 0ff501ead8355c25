"""The `ansible` in-band driver against real hosts (podman containers from the bare-metal host image, each in its
own network namespace) and the real Slurm cluster: every in-band step, its idempotent rerun (changed=0), the host's
dynamic `slurmd -Z` node seen idle through slurmrestd and gone after release; and the faults: SSH unreachable, a
failing task, a changed host key."""

import pytest
from django.utils import timezone

from catalog.choices import ServiceKind
from metering.telemetry import Binding, DcgmDriver
from provisioning.drivers import in_band_driver
from provisioning.drivers.ansible import AnsibleHost, clear_control_sockets
from provisioning.drivers.base import StepError, Target
from tests.provisioning.redfish_emulator import free_loopback_port

DRIVER_VERSION = "550.54.15"


def target_for(host, cluster: str, cards: int = 2, ssh_public_key: str = "", **profile) -> Target:
    return Target(
        run_id=1,
        request_id=1,
        node=host.name,
        devices=tuple({"index": index, "uuid": f"GPU-{host.name}-{index}"} for index in range(cards)),
        snapshot={
            "project": "ml-research",
            "parameters": {"ssh_public_key": ssh_public_key} if ssh_public_key else {},
            "bare_metal_profile": {
                "driver_version": DRIVER_VERSION,
                "monitoring_agent": "node-exporter",
                "target_cluster": cluster,
                "accelerator_model": "h100-80gb",
                "playbooks": "bare-metal-v1",
                **profile,
            },
        },
        os_address=host.address,
        ssh_credentials_ref="test-hosts",
        requester="Dev.One",
        inventory={"cpu_cores": 8, "memory_gb": 2},
    )


def test_the_driver_is_chosen_by_configuration(settings):
    assert type(in_band_driver()).__name__ == "SimulatedHost"  # the demo's default
    settings.PROVISIONING_IN_BAND_DRIVER = "ansible"
    assert isinstance(in_band_driver(timeout=60), AnsibleHost) and in_band_driver(timeout=60).timeout == 60


def test_every_in_band_step_on_a_real_host_then_an_idempotent_rerun_then_release(in_band, slurm):
    host = in_band.hosts.start("bm-life", cards=2)
    target = target_for(host, slurm.name)
    driver = AnsibleHost(timeout=300)

    installed = driver.install_gpu_driver(target, DRIVER_VERSION)
    assert installed["driver_version"] == DRIVER_VERSION and installed["ansible"]["changed"] > 0
    assert in_band.hosts.exec(host, "dpkg-query", "-W", "cc-gpu-driver").stdout.split() == [
        "cc-gpu-driver",
        DRIVER_VERSION,
    ]
    agent = driver.install_monitoring_agent(target, "node-exporter", "dcgm-exporter")
    assert agent["endpoint"] == f"http://{host.address}:9100/metrics" and agent["reporting"] is True
    assert agent["agent_package"].startswith("prometheus-node-exporter 1.")
    assert (agent["gpu_exporter_endpoint"], agent["gpu_series"]) == (f"http://{host.address}:9400/metrics", 2)
    assert_metering_reads_the_gpu_exporter(agent["gpu_exporter_endpoint"], target)
    registered = driver.register_in_cluster(target, slurm.name)
    assert registered["node_name"] == "bm-life" and registered["slurm_state"].startswith("IDLE")
    assert slurm.node_states()["bm-life"] == "idle"
    assert "Gres=gpu:h10080gb:2" in slurm.scontrol("show", "node", "bm-life")
    access = driver.grant_access(target, ssh_public_keys=[], root=False)
    assert (access["user"], access["ssh_keys"], access["root"]) == ("dev_one", 0, False)
    health = driver.health_check(target, ["accelerator_burn_in"])
    assert health["checks"]["driver_loaded"] == f"passed ({DRIVER_VERSION})"
    assert health["checks"]["accelerators_visible"] == "passed (2 device nodes)"

    rerun = [
        driver.install_gpu_driver(target, DRIVER_VERSION),
        driver.install_monitoring_agent(target, "node-exporter", "dcgm-exporter"),
        driver.register_in_cluster(target, slurm.name),
        driver.grant_access(target, ssh_public_keys=[], root=False),
        driver.health_check(target, []),
    ]
    assert [step["ansible"]["changed"] for step in rerun] == [0] * 5, [step["ansible"]["log"] for step in rerun]
    assert all(step["ansible"]["failed"] == 0 and step["ansible"]["ok"] > 0 for step in rerun)

    released = driver.deregister_from_cluster(target, slurm.name)
    assert released["deregistered"] is True and released["removed_now"] is True
    assert "bm-life" not in slurm.node_states()
    assert (
        in_band.hosts.exec(
            host, "sh", "-c", "pgrep -x slurmd || pgrep -x munged || pgrep -x prometheus-node"
        ).returncode
        == 1
    )
    assert in_band.hosts.exec(host, "pgrep", "-f", "cc-gpu-exporter").returncode == 1
    again = driver.deregister_from_cluster(target, slurm.name)
    assert (again["ansible"]["changed"], again["removed_now"]) == (0, False)


def assert_metering_reads_the_gpu_exporter(endpoint: str, target: Target) -> None:
    """Metering's dcgm scraper, pointed at the endpoint, gets an idle card's reading for each of the server's GPUs."""
    bindings = [
        Binding(allocation_id=1, device_id=device["index"], device_uuid=device["uuid"], node=target.node,
                position=device["index"], memory_gb=80, milli=1000, service_kind=ServiceKind.BARE_METAL)
        for device in target.devices
    ]  # fmt: skip
    result = DcgmDriver(url_template=endpoint, timeout=5).read(bindings, timezone.now())
    assert result.errors == []
    assert [(r.device_id, r.utilization_pct, r.memory_used_mb) for r in result.readings] == [(0, 0, 0), (1, 0, 0)]
    assert all(reading.power_w > 0 for reading in result.readings)


def test_a_gpu_exporter_these_playbooks_do_not_know_is_a_permanent_failure(in_band, slurm):
    host = in_band.hosts.start("bm-exporter", cards=1)
    with pytest.raises(StepError) as failure:
        target = target_for(host, slurm.name, cards=1)
        AnsibleHost(timeout=300).install_monitoring_agent(target, "node-exporter", "rocm")
    assert failure.value.code == "playbook_task_failed" and not failure.value.retryable
    assert "The bare-metal-v1 playbooks install no GPU exporter named rocm" in failure.value.message


def test_an_unreachable_host_is_a_retryable_failure_naming_step_and_host(in_band, slurm):
    host = type("Gone", (), {"name": "bm-gone", "address": f"127.0.0.1:{free_loopback_port()}"})()
    with pytest.raises(StepError) as failure:
        AnsibleHost(timeout=60).install_gpu_driver(target_for(host, slurm.name), DRIVER_VERSION)
    assert failure.value.code == "host_unreachable" and failure.value.retryable
    assert "install_gpu_driver" in failure.value.message and "bm-gone" in failure.value.message


def test_a_failing_task_fails_with_its_name_and_message(in_band, slurm):
    host = in_band.hosts.start("bm-fail", cards=2)
    target = target_for(host, slurm.name)
    in_band.hosts.exec(host, "sh", "-c", "rm /dev/nvidia1")
    driver = AnsibleHost(timeout=300)
    driver.install_gpu_driver(target, DRIVER_VERSION)
    with pytest.raises(StepError) as failure:
        driver.health_check(target, [])
    assert failure.value.code == "playbook_task_failed"
    assert (
        "task 'Check every accelerator is visible' failed: Missing device nodes: /dev/nvidia1" in failure.value.message
    )
    assert not failure.value.retryable  # tagged permanent: retrying cannot bring a card back
    assert failure.value.details["task"] == "Check every accelerator is visible"
    assert any("failed: Check every accelerator" in line for line in failure.value.details["ansible"]["log"])


def test_a_version_mismatch_is_permanent(in_band, slurm, settings, tmp_path):
    host = in_band.hosts.start("bm-version", cards=1)
    from devcluster.ansible_hosts import build_driver_package

    other = build_driver_package(tmp_path, "1.0")
    (tmp_path / f"cc-gpu-driver_{DRIVER_VERSION}_all.deb").symlink_to(other)  # the wrong package under the name
    settings.INBAND_PACKAGE_DIR = str(tmp_path)
    with pytest.raises(StepError) as failure:
        AnsibleHost(timeout=300).install_gpu_driver(target_for(host, slurm.name, cards=1), DRIVER_VERSION)
    assert failure.value.code == "playbook_task_failed" and not failure.value.retryable
    assert f"cc-gpu-driver 1.0 is installed, not {DRIVER_VERSION}" in failure.value.message


def test_the_host_key_is_recorded_on_first_contact_and_checked_afterwards(in_band, slurm, settings):
    host = in_band.hosts.start("bm-key", cards=1)
    target = target_for(host, slurm.name, cards=1)
    driver = AnsibleHost(timeout=300)
    driver.install_gpu_driver(target, DRIVER_VERSION)
    known_hosts = in_band.state / "known_hosts" / "bm-key"
    host_key = in_band.hosts.exec(host, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
    assert host_key in known_hosts.read_text()
    new_key = "ssh-keygen -q -t ed25519 -N '' -f /tmp/k && cp /tmp/k /etc/ssh/ssh_host_ed25519_key"
    in_band.hosts.exec(host, "sh", "-c", f"{new_key} && cp /tmp/k.pub /etc/ssh/ssh_host_ed25519_key.pub")
    in_band.hosts.exec(host, "kill", "-HUP", "1")  # sshd (the container's init) re-executes with the new key
    clear_control_sockets()  # a persisted connection would not shake hands again
    with pytest.raises(StepError) as failure:
        driver.install_gpu_driver(target, DRIVER_VERSION)
    assert failure.value.code == "host_key_mismatch" and not failure.value.retryable
    assert driver.request_cleaning(target)["host_key_forgotten"] is True
    assert driver.install_gpu_driver(target, DRIVER_VERSION)["ansible"]["changed"] == 0


def test_a_server_missing_a_card_does_not_join_the_cluster(in_band, slurm):
    host = in_band.hosts.start("bm-card", cards=2)
    in_band.hosts.exec(host, "rm", "/dev/nvidia1")
    with pytest.raises(StepError) as failure:
        AnsibleHost(timeout=300).register_in_cluster(target_for(host, slurm.name), slurm.name)
    assert failure.value.code == "playbook_task_failed" and not failure.value.retryable
    assert "task 'Start munged and slurmd as a dynamic node" in failure.value.message
    assert "can't stat gres.conf file /dev/nvidia1" in failure.value.message  # slurmd's own words, from its log
    assert "bm-card" not in slurm.node_states()


def test_a_playbook_killed_midway_is_resumed_harmlessly(in_band, slurm):
    """What a worker dying during a playbook leaves: ansible-playbook killed halfway (here by the step's timeout);
    the step's next attempt finishes the job, and one more changes nothing."""
    host = in_band.hosts.start("bm-killed", cards=1)
    target = target_for(host, slurm.name, cards=1)
    with pytest.raises(StepError) as failure:
        AnsibleHost(timeout=2).install_monitoring_agent(target, "node-exporter")
    assert failure.value.code == "playbook_timeout" and failure.value.retryable
    assert "bm-killed" in failure.value.message
    resumed = AnsibleHost(timeout=300).install_monitoring_agent(target, "node-exporter")
    assert resumed["reporting"] is True
    assert AnsibleHost(timeout=300).install_monitoring_agent(target, "node-exporter")["ansible"]["changed"] == 0
