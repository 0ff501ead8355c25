"""Issue 37 item 7, on the real local Slurm cluster (devcluster/slurm_cluster.py): catalog text in an image reaches the
batch script only as quoted words, so a newline or a command substitution in an image's name, version or reference
runs nothing on the node (before, a newline in a reference ran the next line as a command); a job's output is its
user's alone (0600 in a directory of its own, where it was 0644); and SLURM_JOB_DIRECTORY may not be a shared
temporary directory."""

import stat
import subprocess
import time

import pytest
from django.core.checks import Error, Warning

from provisioning.checks import check_slurm_job_directory
from provisioning.drivers.base import Target
from provisioning.drivers.slurm import SlurmWorkloads
from scheduling.choices import ExecutionBackend
from tests.provisioning.test_slurm_backend import on_slurm  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def _target(cluster, request_id: int) -> Target:
    gpu = cluster.node_shape.gpu_type
    return Target(
        run_id=request_id,
        request_id=request_id,
        node=cluster.node_names[2],
        devices=({"index": 0, "uuid": "GPU-x", "model": gpu, "model_slug": gpu, "milli": 1000},),
        snapshot={"demand": {"cpu_cores": 1, "memory_gb": 1}, "duration_hours": 1},
        backend=ExecutionBackend.SLURM,
        allocation_id=request_id,
    )


def _run_to_the_end(api, target: Target, image: dict) -> dict:
    """Submit the job through the driver and wait until Slurm says it ended; the job as Slurm reports it."""
    job_id = SlurmWorkloads().start_workload(target, image)["job_id"]
    deadline = time.monotonic() + 30
    while (job := api.job(job_id))["job_state"] not in ENDED:
        assert time.monotonic() < deadline, job["job_state"]
        time.sleep(0.1)
    return job


def test_a_newline_or_a_command_substitution_in_an_image_runs_nothing_on_the_node(on_slurm):  # noqa: F811
    """The image as an approved snapshot may still hold what the catalog now refuses (approved before the rule)."""
    cluster, api = on_slurm.cluster, on_slurm.api
    markers = {part: cluster.job_dir / f"injected-by-{part}" for part in ("reference", "name", "version")}
    image = {
        "name": f"img$(touch {markers['name']})",
        "version": f"1`touch {markers['version']}`",
        "reference": f"registry.test/img:1\ntouch {markers['reference']} #",
        "configuration": {"command": "echo workload ran"},
    }

    job = _run_to_the_end(api, _target(cluster, 5001), image)

    assert job["job_state"] == "COMPLETED"
    assert [marker.name for marker in markers.values() if marker.exists()] == []
    output = (cluster.job_dir / f"cc-request-5001-{job['job_id']}.out").read_text()
    assert output.splitlines()[0].startswith(f"request 5001 ({image['name']}:{image['version']}) on ")
    assert output.splitlines()[-1] == "workload ran"


def test_a_jobs_output_is_its_users_alone(on_slurm, settings):  # noqa: F811
    cluster, api = on_slurm.cluster, on_slurm.api
    image = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {"command": "true"}}

    job = _run_to_the_end(api, _target(cluster, 5002), image)

    output = cluster.job_dir / f"cc-request-5002-{job['job_id']}.out"
    assert (output.owner(), stat.S_IMODE(output.stat().st_mode)) == (cluster.user_name, 0o600)
    assert (cluster.job_dir.owner(), stat.S_IMODE(cluster.job_dir.stat().st_mode)) == (cluster.user_name, 0o700)
    other_user = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(output)], capture_output=True, text=True)
    assert other_user.returncode != 0 and "Permission denied" in other_user.stderr


@pytest.mark.parametrize(
    ("directory", "code"),
    [
        ("/tmp", "provisioning.E002"),
        ("/var/tmp/", "provisioning.E002"),
        ("/dev/shm", "provisioning.E002"),
        ("jobs", "provisioning.E001"),
    ],
)
def test_a_shared_temporary_or_relative_job_directory_fails_the_system_check(settings, directory, code):
    settings.SLURM_JOB_DIRECTORY = directory

    [problem] = check_slurm_job_directory()

    assert isinstance(problem, Error) and problem.id == code


def test_a_job_directory_open_to_others_on_this_host_is_a_warning_and_a_private_one_passes(settings, tmp_path):
    settings.SLURM_JOB_DIRECTORY = str(tmp_path)
    tmp_path.chmod(0o755)
    [problem] = check_slurm_job_directory()
    assert isinstance(problem, Warning) and problem.id == "provisioning.W001"

    tmp_path.chmod(0o700)
    assert check_slurm_job_directory() == []
    settings.SLURM_JOB_DIRECTORY = "/var/lib/compute-catalog/slurm-jobs"  # the default; not on this host
    assert check_slurm_job_directory() == []
