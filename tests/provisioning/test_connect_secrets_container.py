"""Issue 37 item 3 on the real container backend (podman, runc; devcluster/podman_runtime.py): the workspace's
Jupyter token is the requester's alone. It is in no step output, delivered record, timeline event, audit row, log
line, container environment or container log; it is stored encrypted; the notebook takes no other; and when the
requester changes it, the running notebook refuses the old token and every browser signed in with it at once, while
its kernels keep running. Release forgets it.

Before, the token was in the container's environment, the start step's output, the delivered record and the ACTIVE
event, and every viewer of the request got it with the Jupyter URL."""

import json
import logging

import httpx
import pytest

from provisioning.connect import connect_secrets_shown
from provisioning.models import ConnectSecret, ProvisioningRun, ProvisioningStep
from requests import services as request_services
from requests.choices import EventCode, RequestState
from tenancy.models import AuditEvent
from tests.devcluster_fixtures import podman_service  # noqa: F401  (fixture)
from tests.provisioning.test_container_backend import workspace  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db


def _everything_recorded(request, workspace) -> str:  # noqa: F811
    """What the platform and the node kept about the workspace, as one text."""
    container = workspace.podman.inspect(
        ProvisioningRun.objects.get(request=request, kind="provision").delivered["workload"]
    )
    kept = {
        "steps": list(ProvisioningStep.objects.filter(run__request=request).values("output", "log", "error")),
        "runs": list(ProvisioningRun.objects.filter(request=request).values("delivered", "failure")),
        "timeline": list(request.events.values("message", "data")),
        "audit": list(AuditEvent.objects.values("reason", "data", "target_repr")),
        "container": container,
        "container_log": workspace.podman.run("logs", container["Name"], with_stderr=True),
    }
    return json.dumps(kept, default=str)


def _status(notebook: str, **kwargs) -> int:
    return httpx.get(f"{notebook}api/status", timeout=10, **kwargs).status_code


def test_the_jupyter_token_is_the_requesters_and_recorded_nowhere_else(workspace, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    request = workspace.order(jupyter=True)
    assert request.state == RequestState.ACTIVE

    shown = connect_secrets_shown(request, request.requester)["jupyter"]
    token, notebook = shown["secret"], ProvisioningRun.objects.get(request=request).delivered["access"]["jupyter"]

    assert "token" not in notebook and shown["access"] == f"{notebook}?token={token}"
    assert token not in _everything_recorded(request, workspace)
    assert token not in caplog.text
    stored = ConnectSecret.objects.get(request=request, name="jupyter")
    assert token not in stored.ciphertext
    for viewer in (workspace.team.developer2, workspace.team.lead, workspace.team.approver, workspace.team.operator):
        assert connect_secrets_shown(request, viewer) is None
    assert _status(notebook, params={"token": token}) == 200
    assert _status(notebook) == 403
    assert _status(notebook, params={"token": "not-the-token"}) == 403


def test_rotating_changes_the_running_notebooks_token_and_signs_out_every_browser(workspace, api_as, run_on_commit):  # noqa: F811
    request = workspace.order(jupyter=True)
    old = connect_secrets_shown(request, request.requester)["jupyter"]["secret"]
    notebook = ProvisioningRun.objects.get(request=request).delivered["access"]["jupyter"]
    browser = httpx.Client(timeout=10)
    assert browser.get(f"{notebook}tree", params={"token": old}).status_code == 200  # signed in: a login cookie
    assert browser.get(f"{notebook}api/status").status_code == 200
    kernel = httpx.post(f"{notebook}api/kernels", params={"token": old}, json={}, timeout=30).json()["id"]

    answer = api_as(request.requester).post(f"/api/v1/requests/{request.pk}/connect-secrets/jupyter/rotate/")

    assert answer.status_code == 200, answer.content
    new = answer.json()["secret"]
    assert new != old and answer.json()["access"] == f"{notebook}?token={new}"
    assert _status(notebook, params={"token": old}) == 403
    assert browser.get(f"{notebook}api/status").status_code == 403  # the cookie earned with the old token
    assert _status(notebook, params={"token": new}) == 200
    kernels = httpx.get(f"{notebook}api/kernels", params={"token": new}, timeout=10).json()
    assert [running["id"] for running in kernels] == [kernel]  # the notebook was not restarted
    rotated = request.events.get(code=EventCode.CONNECT_SECRET_ROTATED)
    assert rotated.actor == request.requester and new not in json.dumps(rotated.data) + rotated.message
    assert new not in _everything_recorded(request, workspace)

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    assert not ConnectSecret.objects.filter(request=request).exists()


def test_a_workspace_without_jupyter_has_no_secret(workspace):  # noqa: F811
    request = workspace.order(jupyter=False)

    assert request.state == RequestState.ACTIVE
    assert connect_secrets_shown(request, request.requester) == {}
    assert not ConnectSecret.objects.filter(request=request).exists()
