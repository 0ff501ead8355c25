"""A worker killed during a playbook, with real worker processes: a `qcluster` runs a bare-metal order (static and
fake BMCs, the installer's callback, the Ansible steps on a real test host) and is SIGKILLed, whole process group,
while ansible-playbook runs install_monitoring_agent. The playbook dies with it (setpriv --pdeathsig), the step's
short lease lapses, a second `qcluster` takes the step over, first killing what is left of the dead worker's playbook
run, and runs the playbook again; the run reaches active, only that step ran twice, and the host shows one agent,
no half-installed package, and nothing left to change (a further rerun reports changed=0)."""

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django_q.conf import Conf

from provisioning import engine
from provisioning.choices import RunKind, StepState
from provisioning.drivers.ansible import AnsibleHost, playbook_processes
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.targets import run_target
from requests.choices import RequestState
from requests.models import ResourceRequest
from tests.provisioning.test_ansible_pipeline import server  # noqa: F401  (fixture)
from tests.provisioning.test_crash_safety import LEASE_SECONDS, kill, lease_lapsed, start_worker, wait_for
from tests.provisioning.test_redfish_inventory import hgx  # noqa: F401  (fixture)
from tests.provisioning.test_redfish_pipeline import installer_callback_from_media

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)
STEP = "install_monitoring_agent"


def worker_environment(settings) -> dict[str, str]:
    """What the test's settings fixtures set, for a worker process: the BMC and in-band drivers and the cluster."""
    names = [
        "PROVISIONING_BMC_DRIVER", "PROVISIONING_IN_BAND_DRIVER", "ANSIBLE_STATE_DIR", "INBAND_PACKAGE_DIR",
        "INBAND_MUNGE_KEY_FILE", "INBAND_SLURMCTLD_ADDRESS", "SLURM_REST_URL", "SLURM_USER_NAME", "SLURM_JWT",
        "SLURM_JWT_FILE", "SLURM_CONF",
    ]  # fmt: skip
    return {
        **{name: str(getattr(settings, name)) for name in names},
        "REDFISH_VERIFY_TLS": "0",
        "SSH_CREDENTIALS": json.dumps(settings.SSH_CREDENTIALS),
    }


def playbook_in_a_task(marker: Path) -> tuple[int, str] | None:
    """The leader pid and run token of the playbook the worker runs for the step, once it has a task in flight on the
    host (an ssh client of its own)."""
    if not marker.exists() or len(marker.read_text().split()) != 2:
        return None
    leader, token = marker.read_text().split()
    in_flight = any(Path(command.split(" ", 1)[0]).name == "ssh" for command in playbook_processes(token).values())
    return (int(leader), token) if in_flight else None


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_a_worker_killed_during_a_playbook_is_replaced_and_the_rerun_is_harmless(
    server,  # noqa: F811  (the imported fixture)
    api,
    settings,
    monkeypatch,
    tmp_path,
):
    monkeypatch.setattr(Conf, "SYNC", False)  # this process enqueues into the broker; the workers run the tasks
    settings.PROVISIONING_LEASE_SECONDS = LEASE_SECONDS
    environment = worker_environment(settings)
    marker = Path(settings.ANSIBLE_STATE_DIR) / "running" / server.node.name
    log = tmp_path / "worker.log"
    first = start_worker(log, **environment)
    try:
        request = server.order()  # the worker validates, boots and power-cycles the server
        wait_for(
            lambda: ProvisioningStep.objects.filter(name="wait_for_install", state=StepState.WAITING).exists(),
            seconds=120,
            what="the server to boot the installer",
            log=log,
        )
        callback, token = installer_callback_from_media(server.node.bmc_address)
        answer = api.post(  # from the server it installed: the node's address
            urlsplit(callback).path,
            {"token": token, "status": "succeeded"},
            format="json",
            REMOTE_ADDR=server.host.address,
        )
        assert answer.status_code == 202
        wait_for(
            lambda: ProvisioningStep.objects.filter(name=STEP, state=StepState.RUNNING).exists(),
            seconds=300,
            what=f"{STEP} to be running",
            log=log,
        )
        leader, token = wait_for(lambda: playbook_in_a_task(marker), seconds=60, what="a task in flight", log=log)
    finally:
        kill(first)
    assert playbook_processes(token), "the playbook ended before the worker was killed"
    step = ProvisioningStep.objects.get(name=STEP)
    assert step.state == StepState.RUNNING  # the dead worker's lease remains
    # ansible-playbook died with its worker; only its fork finishing the task in flight (and its ssh) may remain.
    wait_for(lambda: _gone(leader), seconds=10, what="ansible-playbook to die with its worker", log=None)

    wait_for(lambda: lease_lapsed(step.pk), seconds=10 * LEASE_SECONDS, what="the lease to lapse", log=log)
    second_log = tmp_path / "worker2.log"
    second = start_worker(second_log, **environment)
    try:
        assert engine.steps_resume_due() == 1
        wait_for(
            lambda: ResourceRequest.objects.get(pk=request.pk).state in (RequestState.ACTIVE, RequestState.FAILED),
            seconds=300,
            what="the request to settle",
            log=second_log,
        )
    finally:
        kill(second)

    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE, list(request.events.values_list("message", flat=True))
    assert playbook_processes(token) == {}  # nothing of the dead worker's playbook runs any more
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    attempts = dict(run.steps.values_list("name", "attempts"))
    assert [attempts[name] for name in ("install_gpu_driver", STEP, "register_cluster", "health_check")] == [1, 2, 1, 1]
    resumed = run.steps.get(name=STEP)
    assert "lease expired" in resumed.log
    assert resumed.output["reporting"] is True and resumed.output["ansible"]["failed"] == 0

    hosts, host = server.in_band.hosts, server.host
    assert hosts.exec(host, "pgrep", "-c", "-x", "prometheus-node").stdout.strip() == "1"  # one agent, not two
    assert hosts.exec(host, "dpkg", "--audit").stdout == ""  # no package left half-installed
    target = run_target(run)
    agent = target.snapshot["bare_metal_profile"]["monitoring_agent"]
    again = AnsibleHost(timeout=300).install_monitoring_agent(target, agent)
    assert again["ansible"]["changed"] == 0, again["ansible"]["log"]
