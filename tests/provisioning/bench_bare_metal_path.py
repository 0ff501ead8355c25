"""The whole bare-metal path, timed (`make bench` runs this module through bench/report/bare_metal_path.py; it is
no test: pytest collects it only when named, never in the suite). On the fixtures of the end-to-end tests: hardware
validation against sushy-static (the HGX mockup with 8 GPUs), one-time boot and power cycle on sushy-emulator
--fake, the installer's callback over HTTP, every in-band step as an Ansible playbook on a fresh podman test host
joining the real Slurm cluster, to active. Then the idempotent rerun: every step of the pipeline run again on the
same server, as a resumed run would (the Ansible steps must report changed=0), except the two that would start a
new install (NOT_RERUN).

Writes one JSON row per step and one for the whole path to BENCH_OUTPUT: wall seconds of the first run (the step
record's started_at -> finished_at; the whole path from the order to active) and of the rerun, and the CPU seconds of
this process plus its children (ansible-playbook, ssh) over the whole path.
"""

import json
import os
import resource
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from provisioning.choices import RunKind
from provisioning.drivers.base import StepPending
from provisioning.models import ProvisioningRun
from provisioning.pipelines import definition_of
from provisioning.steps import StepContext
from provisioning.targets import run_target
from requests.choices import RequestState
from tests.provisioning.test_ansible_pipeline import server  # noqa: F401  (fixture)
from tests.provisioning.test_redfish_inventory import hgx  # noqa: F401  (fixture)
from tests.provisioning.test_redfish_pipeline import installer_callback_from_media

pytestmark = pytest.mark.django_db
WHOLE_PATH = "whole path (order -> active)"
# A resumed run never repeats a completed step, and these two, repeated, would boot the installer again (a new
# install with a new callback token): they are timed once.
NOT_RERUN = {"boot_installer", "power_cycle"}


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def rerun(step) -> tuple[float, int | None]:
    """The step's handler once more on the same server, asked again while it is pending (as the engine would)."""
    started = time.monotonic()
    while True:
        context = StepContext(run=step.run, step=step, target=run_target(step.run))
        try:
            output = definition_of(step.run.pipeline, step.run.kind, step.position).handler(context)
        except StepPending as pending:
            time.sleep(pending.retry_after)
            continue
        finally:
            context.close()
        return time.monotonic() - started, output.get("ansible", {}).get("changed")


def test_time_the_whole_bare_metal_path(server, api, run_on_commit):  # noqa: F811  (the imported fixture)
    cpu_before, started = cpu_seconds(), time.monotonic()
    request = server.order()
    callback, token = installer_callback_from_media(server.node.bmc_address)
    answer = run_on_commit(  # from the server it installed: the node's address
        api.post,
        urlsplit(callback).path,
        {"token": token, "status": "succeeded"},
        format="json",
        REMOTE_ADDR=server.host.address,
    )
    assert answer.status_code == 202
    request.refresh_from_db()
    first_total, cpu = time.monotonic() - started, cpu_seconds() - cpu_before
    assert request.state == RequestState.ACTIVE, request.events.values_list("message", flat=True)

    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    steps = list(run.steps.select_related("run__request", "run__allocation__node").order_by("position"))
    rows = []
    for step in steps:
        seconds, changed = ("-", None) if step.name in NOT_RERUN else rerun(step)
        assert changed in (None, 0), f"the rerun of {step.name} changed {changed} things"
        rows.append(
            {
                "step": step.name,
                "first_s": round((step.finished_at - step.started_at).total_seconds(), 2),
                "rerun_s": seconds if seconds == "-" else round(seconds, 2),
                "rerun_changed": "-" if changed is None else changed,
                "first_cpu_s": "-",
            }
        )
    rows.append(
        {
            "step": WHOLE_PATH,
            "first_s": round(first_total, 2),
            "rerun_s": round(sum(row["rerun_s"] for row in rows if row["rerun_s"] != "-"), 2),
            "rerun_changed": sum(row["rerun_changed"] for row in rows if row["rerun_changed"] != "-"),
            "first_cpu_s": round(cpu, 2),
        }
    )
    Path(os.environ.get("BENCH_OUTPUT", "bench_bare_metal_path.json")).write_text(json.dumps(rows))
