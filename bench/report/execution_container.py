"""Workspaces on the container backend: approved one-GPU requests from queued to active in this machine's podman,
beside `podman run` alone in the same run."""

import json
from io import StringIO

from django.core.management import call_command

from bench.execution import Command as BenchExecution
from bench.report.execution import headline as headline  # the same rows, read the same way
from bench.report.execution import rows_of

TITLE = "Execution: container backend (podman), beside podman alone"
REQUESTS = 20
ROUNDS = 4
DESCRIPTION = (
    f"`python -m bench execution --backend container --requests {REQUESTS} --rounds {ROUNDS} --json`: this machine's "
    "rootful podman (runc) as two nodes' runtime behind its REST socket, the workspace image already built and "
    "cached (its debootstrap is not measured), 8 real `qcluster` workers. Each round, in an order that alternates: "
    "the platform (from the scheduling cycle's start, each approved one-GPU request (1 CPU, 1 GiB, SSH only) "
    "through prepare_image (digest verified), start_workload (a container with its fake device node bound and SSH "
    "published), readiness (sshd's banner on the published port) and publish_access to active; then released) and "
    "podman alone (the same `podman run`, image and options as the driver's, one after another from one client, "
    "each timed from the first to its sshd answering; then removed). `started`: when each side's first `podman "
    "run` began and its last one returned (the platform's from the cycle's start). `load`: the 1-minute load "
    "average before and after each round (2 cores shared with other work). Targets (issue 32): ratio >= 0.7; p50 "
    "queued -> active <= 5 s."
)
TARGET = "ratio >= 0.7; p50 queued -> active <= 5 s"


def run() -> list[dict]:
    out = StringIO()
    call_command(
        BenchExecution(), backend="container", requests=REQUESTS, rounds=ROUNDS, as_json=True, force=True, stdout=out
    )
    return rows_of(json.loads(out.getvalue().strip().splitlines()[-1]))
