"""Bare metal's in-band steps on the `ansible` driver: playbooks over SSH on real test hosts, first run and rerun."""

import json
import os
from io import StringIO

from django.core.management import call_command

from bench.headline import Headline, row_where
from bench.in_band import Command as BenchInBand

TITLE = "Bare metal: in-band steps on the Ansible driver"
HOSTS = 2
DESCRIPTION = (
    f"`python -m bench in_band --hosts {HOSTS} --json`: ansible-core (`.venv-ansible`) over SSH with pipelining and "
    "ControlPersist to fresh podman test hosts (the bare-metal host image, cached: debootstrap not measured; 8 fake "
    "GPUs each), joining a one-node real Slurm cluster as a dynamic node (`slurmd -Z`, idle through slurmrestd). "
    "Per step, the median over the hosts of the first run and of the idempotent rerun on the same host "
    "(`rerun_changed`: Ansible's changed count, must be 0); `all in-band steps` is their sum; deregister_cluster's "
    "rerun finds the node gone. Not in it: BMC validation, boot and power (see the Redfish tests) and the step "
    "engine's own bookkeeping. `load_1m`: the load average when the run started (2 cores shared). Target: the rerun "
    "of all in-band steps < 30 s."
)
TARGET = "rerun of all in-band steps < 30 s, nothing changed"


def headline(rows: list[dict]) -> Headline:
    steps = row_where(rows, step="all in-band steps")
    return Headline(f"rerun {steps['rerun_s']} s (first run {steps['first_s']} s), {steps['rerun_changed']} changed")


def run() -> list[dict]:
    load = os.getloadavg()[0]
    out = StringIO()
    call_command(BenchInBand(), hosts=HOSTS, as_json=True, stdout=out)
    rows = [json.loads(line) for line in out.getvalue().strip().splitlines()]
    return [{**row, "load_1m": round(load, 1)} for row in rows]
