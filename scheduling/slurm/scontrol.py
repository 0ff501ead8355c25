"""Node drain and resume through `scontrol update`, and dynamic node removal through `scontrol delete`: slurmrestd
v0.0.38 has neither. A job's time limit raised where the REST token's user may not raise it (Slurm lets only
operators and SlurmUser do that). And reservations made and deleted: slurmrestd v0.0.38 reads them, never writes them.

scontrol finds the cluster through SLURM_CONF (setting) and authenticates with munge, so it runs on a host that is
part of the Slurm cluster (a login node) as a user Slurm lets change node states (root or SlurmUser).
"""

import os
import subprocess

from django.conf import settings

SCONTROL_TIMEOUT_SECONDS = 30


class ScontrolError(RuntimeError):
    """scontrol failed or could not be run; the message holds what it printed."""


class ScontrolUnreachable(ScontrolError):
    """slurmctld did not answer scontrol (down, restarting, or too slow): never a final answer."""


# What scontrol prints when it cannot reach slurmctld (Slurm's own error strings).
UNREACHABLE_MARKS = ("unable to contact slurm controller", "socket timed out", "connection refused")


def drain_node(name: str, reason: str) -> None:
    _update(f"nodename={name}", "state=drain", f"reason={reason}")


def resume_node(name: str) -> None:
    _update(f"nodename={name}", "state=resume")


def job_time_limit(job_id: int, minutes: int) -> None:
    _update(f"jobid={job_id}", f"TimeLimit={minutes}")


def delete_node(name: str) -> None:
    """Remove a dynamic node (one that joined with `slurmd -Z`) from slurmctld."""
    _run("delete", f"nodename={name}")


def create_reservation(name: str, *, users: str, nodes: list[str], minutes: int) -> None:
    """A reservation of whole nodes from now for `minutes` (Slurm refuses TRES=gres/gpu: it reserves nodes or cores).
    The jobs already on them keep running (ignore_jobs): work the platform ended before the window may still be
    winding down."""
    _run(
        "create",
        "reservation",
        f"reservationname={name}",
        f"users={users}",
        "starttime=now",
        f"duration={minutes}",
        f"nodes={','.join(nodes)}",
        "flags=ignore_jobs",
    )


def delete_reservation(name: str) -> None:
    _run("delete", f"reservationname={name}")


def _update(*arguments: str) -> None:
    _run("update", *arguments)


def _run(verb: str, *arguments: str) -> None:
    command = [settings.SLURM_SCONTROL, verb, *arguments]
    env = {**os.environ, "SLURM_CONF": settings.SLURM_CONF} if settings.SLURM_CONF else None
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as error:
        raise ScontrolUnreachable(f"scontrol {verb} got no answer from slurmctld: {error}") from error
    except OSError as error:
        raise ScontrolError(f"scontrol could not run: {error}") from error
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        unreachable = any(mark in output.lower() for mark in UNREACHABLE_MARKS)
        raise (ScontrolUnreachable if unreachable else ScontrolError)(
            f"scontrol {verb} failed ({result.returncode}): {output}"
        )
