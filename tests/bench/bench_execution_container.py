"""Workspaces on the container backend: approved one-GPU requests from queued to active in this machine's podman."""

import json
import os
from io import StringIO

from django.core.management import call_command

TITLE = "Execution: container backend (podman)"
REQUESTS = 20
DESCRIPTION = (
    f"`manage.py bench_execution --backend container --requests {REQUESTS} --json`: this machine's rootful podman "
    "(runc) as two nodes' runtime behind its REST socket, the workspace image already built and cached (its "
    "debootstrap is not measured), 8 real `qcluster` workers. From the scheduling cycle's start, each approved "
    "one-GPU request (1 CPU, 1 GiB, SSH only) through prepare_image (digest verified), start_workload (a container "
    "with its fake device node bound and SSH published), readiness (sshd's banner on the published port) and "
    "publish_access to active. `load_1m`: the machine's load average when the run started (2 cores shared with other "
    "work). Target: p50 queued -> active <= 5 s."
)


def run() -> list[dict]:
    load = os.getloadavg()[0]
    out = StringIO()
    call_command("bench_execution", backend="container", requests=REQUESTS, as_json=True, force=True, stdout=out)
    return [{**json.loads(out.getvalue().strip().splitlines()[-1]), "load_1m": round(load, 1)}]
