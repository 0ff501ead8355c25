"""System checks of provisioning's settings (run by `manage.py check`, runserver, migrate, qcluster)."""

import os
import stat

from django.conf import settings
from django.core.checks import Error, Warning

# Directories every user of a node may write: a job's output there has a name anyone can predict and take first.
SHARED_TEMPORARY_DIRECTORIES = frozenset({"/tmp", "/var/tmp", "/dev/shm"})


def check_slurm_job_directory(app_configs=None, **_kwargs) -> list[Error | Warning]:
    """SLURM_JOB_DIRECTORY holds the Slurm jobs' output: it must be a directory of the job user's own on the nodes
    (docs/provisioning.md, the Slurm backend), never a shared temporary directory."""
    directory = settings.SLURM_JOB_DIRECTORY
    hint = "Use a directory the Slurm user (SLURM_USER_NAME) owns on every node, mode 0700."
    if not os.path.isabs(directory):
        return [Error(f"SLURM_JOB_DIRECTORY {directory!r} is not an absolute path.", hint=hint, id="provisioning.E001")]
    if os.path.normpath(directory) in SHARED_TEMPORARY_DIRECTORIES:
        return [
            Error(
                f"SLURM_JOB_DIRECTORY is {directory}, which every user of a node may write: the jobs' output would "
                "have names anyone can predict there.",
                hint=hint,
                id="provisioning.E002",
            )
        ]
    try:
        mode = os.stat(directory).st_mode
    except OSError:  # not on this host: the nodes have it
        return []
    if stat.S_IMODE(mode) & 0o077:
        return [
            Warning(
                f"SLURM_JOB_DIRECTORY {directory} on this host is open to others (mode {stat.S_IMODE(mode):04o}).",
                hint=hint,
                id="provisioning.W001",
            )
        ]
    return []


def check_driver_registries(app_configs=None, *, registries=None, **_kwargs) -> list[Error]:
    """Every member of a driver enum (execution backends, BMC and in-band drivers, serving runtimes) has a driver in
    its registry (provisioning/drivers/__init__.py): a backend added to an enum without a driver fails here, at
    `manage.py check`, not on the first request placed on it."""
    from provisioning.drivers import REGISTRIES

    errors = []
    for registry in REGISTRIES if registries is None else registries:
        for value in registry.missing():
            errors.append(
                Error(
                    f"{registry.enum.__name__}.{value!r} has no {registry.kind} driver.",
                    hint="Register one in provisioning/drivers/__init__.py (docs/adding-a-backend.md).",
                    id="provisioning.E010",
                )
            )
    return errors
