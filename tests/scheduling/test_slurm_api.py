"""The slurmrestd v0.0.38 client against the real local cluster (devcluster/slurm_cluster.py)."""

import logging
import time

import pytest

from devcluster.slurm_cluster import free_ports
from scheduling.slurm.api import (
    CONTROLLER,
    SLURMRESTD,
    SlurmApi,
    SlurmApiError,
    SlurmNotConfigured,
    SlurmNotFound,
    SlurmUnavailable,
)


@pytest.fixture
def api(slurm_settings):
    with SlurmApi.from_settings() as client:
        yield client


def sleep_job(slurm, node: str, name: str = "api-test") -> dict:
    return {
        "name": name,
        "partition": slurm.partition,
        "nodelist": node,
        "gres": f"gpu:{slurm.node_shape.gpu_type}:1",
        "time_limit": 5,
        "current_working_directory": str(slurm.job_dir),
        "environment": {"PATH": "/usr/bin:/bin"},
    }


def wait_for_job_state(api, job_id: int, state: str, seconds: float = 15) -> dict:
    deadline = time.monotonic() + seconds
    while (job := api.job(job_id))["job_state"] != state:
        assert time.monotonic() < deadline, f"job {job_id} is {job['job_state']}, not {state}"
        time.sleep(0.2)
    return job


def test_nodes_and_one_node(api, slurm):
    nodes = api.nodes()

    assert sorted(node["name"] for node in nodes) == sorted(slurm.node_names)
    node = api.node(slurm.node_names[1])
    assert (node["name"], node["gres"], node["cpus"], node["real_memory"], node["state"]) == (
        slurm.node_names[1],
        "gpu:a100:2",
        32,
        262144,
        "idle",
    )


def test_ping_and_diag(api):
    assert [ping["ping"] for ping in api.ping()] == ["UP"]
    assert "jobs_submitted" in api.diag()


def test_submit_find_and_cancel_a_job(api, slurm):
    node = slurm.node_names[2]

    submitted = api.submit_job("#!/bin/bash\nsleep 300\n", sleep_job(slurm, node))

    job = wait_for_job_state(api, submitted["job_id"], "RUNNING")
    assert (job["nodes"], job["name"]) == (node, "api-test")
    assert job["gres_detail"] == ["gpu:a100:1(IDX:0)"]
    assert submitted["job_id"] in [listed["job_id"] for listed in api.jobs()]
    api.cancel_job(submitted["job_id"])
    assert wait_for_job_state(api, submitted["job_id"], "CANCELLED")["job_state"] == "CANCELLED"


def test_an_unknown_job_is_not_found_with_slurms_errors(api):
    with pytest.raises(SlurmNotFound) as caught:
        api.job(999999)

    assert [error["error_number"] for error in caught.value.errors] == [2017]
    assert "Unable to find JobId=999999" in str(caught.value)
    assert not caught.value.retryable


def test_a_refused_submission_carries_slurms_reason(api, slurm):
    with pytest.raises(SlurmApiError) as caught:
        api.submit_job("#!/bin/bash\ntrue\n", {**sleep_job(slurm, slurm.node_names[0]), "partition": "no-such"})

    assert "Invalid partition name specified" in str(caught.value)
    assert caught.value.errors[0]["error_code"] == 2000


def test_a_bad_token_is_refused_and_never_shown(slurm_settings, settings, caplog):
    settings.SLURM_JWT = slurm_settings.token[:-6] + "AAAAAA"
    caplog.set_level(logging.DEBUG)

    with SlurmApi.from_settings() as client, pytest.raises(SlurmApiError) as caught:
        client.nodes()

    assert caught.value.errors
    for text in (str(caught.value), repr(caught.value.errors), repr(client), caplog.text):
        assert settings.SLURM_JWT not in text
        assert slurm_settings.token not in text


def test_the_token_is_read_from_a_secret_file(slurm_settings, settings, tmp_path):
    token_file = tmp_path / "slurm.jwt"
    token_file.write_text(f"SLURM_JWT={slurm_settings.token}\n")  # as `scontrol token` prints it
    settings.SLURM_JWT, settings.SLURM_JWT_FILE = "", str(token_file)

    with SlurmApi.from_settings() as client:
        assert len(client.nodes()) == len(slurm_settings.node_names)


def test_missing_settings_are_named(settings):
    settings.SLURM_REST_URL, settings.SLURM_USER_NAME, settings.SLURM_JWT, settings.SLURM_JWT_FILE = "", "u", "", ""

    with pytest.raises(SlurmNotConfigured, match="no URL, token"):
        SlurmApi.from_settings()


def test_nothing_listening_is_unavailable_and_retryable():
    (port,) = free_ports(1)

    client = SlurmApi(url=f"http://127.0.0.1:{port}", user_name="u", token="t", timeout=2)
    with client, pytest.raises(SlurmUnavailable) as caught:
        client.ping()

    assert caught.value.retryable


def test_a_stopped_controller_is_unavailable_and_retryable(api, slurm):
    slurm.stop_daemon("slurmctld")
    try:
        with pytest.raises(SlurmUnavailable) as caught:
            api.submit_job("#!/bin/bash\ntrue\n", sleep_job(slurm, slurm.node_names[0]))
    finally:
        slurm.start_daemon("slurmctld")

    assert caught.value.retryable
    assert "Unable to contact slurm controller" in str(caught.value)


def test_slurmrestd_s_answer_for_a_stopped_controller_is_unavailable_not_a_refusal(slurm_settings, slurm):
    """With slurmctld stopped, slurmrestd 22.05 answers a query after about 9 s with HTTP 500 and error -1
    ("Unspecified error"): the controller is out of reach, which is worth asking again."""
    slurm.stop_controller()
    try:
        with SlurmApi.from_settings() as client, pytest.raises(SlurmUnavailable) as caught:
            client._client.timeout = 30  # wait for slurmrestd's own answer rather than time out first
            client.jobs()
    finally:
        slurm.start_controller()

    assert (caught.value.status, caught.value.part) == (500, CONTROLLER)
    assert [error.get("error_number") for error in caught.value.errors] == [-1]


def test_slurmrestd_stopped_is_unavailable_and_names_slurmrestd(api, slurm):
    slurm.stop_rest()
    try:
        with pytest.raises(SlurmUnavailable) as caught:
            api.jobs()
    finally:
        slurm.start_rest()

    assert caught.value.part == SLURMRESTD and "unreachable: ConnectError" in str(caught.value)


def test_an_unknown_partition_is_a_final_refusal(api, slurm):
    with pytest.raises(SlurmApiError) as caught:
        api.submit_job("#!/bin/bash\ntrue\n", {**sleep_job(slurm, slurm.node_names[0]), "partition": "nowhere"})

    assert not caught.value.retryable and not isinstance(caught.value, SlurmUnavailable)
    assert "Invalid partition name specified (error 2000)" in str(caught.value)
