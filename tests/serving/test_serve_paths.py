"""Issue 37 item 7: /serve/<deployment>/v1/<path> reaches a replica only under its /v1/. A path with a `.` or `..`
segment, an encoded slash, backslash, dot or percent, an empty segment or a control character is refused (400
invalid_path) by the real gateway process and by the web server's relay under gunicorn, before anything is sent on.
Before, `%2e%2e/admin` reached the replica as `/admin`, and `a%2fb` as `a/b`.

The calls go out through http.client, which sends the request target as written (httpx would resolve the dot
segments itself)."""

import http.client
import json
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from config.probes import NotAnswering, wait_until_answers
from serving.paths import PathRefused, replica_path
from tests.config.conftest import REPO, _app_env, _free_port
from tests.serving.test_gateway import CHAT, deployed  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration  # starts processes of its own

served = pytest.mark.django_db(transaction=True, serialized_rollback=True)  # the processes read committed rows

REFUSED = [
    "../../admin",
    "%2e%2e/%2e%2e/admin",
    "%2E%2E/admin",
    "..%2f..%2fadmin",
    "chat%2fcompletions",
    "chat%2Fcompletions",
    "chat%5ccompletions",
    "chat\\..\\completions",
    "%2e/models",
    "./models",
    "models/..",
    "..",
    "a%252fb",
    "/models",
    "models//x",
    "mod%00els",
]
ALLOWED = ["chat/completions", "models", "models/", "models/llama-3-8b-instruct", "completions", "a%20b", "x.y..z"]


@pytest.mark.parametrize("path", REFUSED)
def test_the_rule_refuses_a_path_that_could_leave_v1(path):
    with pytest.raises(PathRefused) as refused:
        replica_path(path)

    assert (refused.value.status_code, refused.value.code, refused.value.details) == (
        400,
        "invalid_path",
        {"path": path},
    )


@pytest.mark.parametrize("path", ALLOWED)
def test_the_rule_passes_a_plain_path_on_as_the_caller_encoded_it(path):
    assert replica_path(path) == path


def send(base_url: str, method: str, target: str, secret: str, body: dict | None = None) -> tuple[int, dict]:
    """One call with the request target exactly as written."""
    where = urlsplit(base_url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        connection.request(method, target, body=payload, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


def assert_stays_under_v1(base_url: str, slug: str, secret: str) -> None:
    for path in REFUSED:
        status, body = send(base_url, "GET", f"/serve/{slug}/v1/{path}", secret)
        assert (status, body["code"], body["details"]) == (400, "invalid_path", {"path": path}), (path, body)
    # What does reach the replica is under its /v1/: its own 404 names the path it was asked for.
    status, body = send(base_url, "GET", f"/serve/{slug}/v1/no-such-thing", secret)
    assert status == 404 and "/v1/no-such-thing" in json.dumps(body), body
    status, body = send(base_url, "POST", f"/serve/{slug}/v1/chat/completions", secret, CHAT)
    assert status == 200 and body["usage"]["completion_tokens"] > 0, body


@served
def test_the_gateway_refuses_paths_that_would_leave_the_replicas_v1(deployed, gateways):  # noqa: F811
    _request, deployment, secret = deployed

    assert_stays_under_v1(gateways().url, deployment.slug, secret)


@pytest.fixture
def relaying_web_server(gateways, tmp_path):
    """gunicorn serving the app, its /serve/ relayed to a real gateway process (GATEWAY_URL)."""
    port, log = _free_port(), tmp_path / "gunicorn.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1", "--threads", "2"],
        cwd=REPO,
        env={**_app_env(), "GATEWAY_URL": gateways().url},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_answers(f"http://127.0.0.1:{port}/healthz", seconds=60, process=server)
    except NotAnswering as down:
        server.kill()
        pytest.fail(f"{down}:\n{log.read_text()[-3000:]}")
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=30)


@served
def test_the_web_servers_relay_refuses_them_too(deployed, relaying_web_server):  # noqa: F811
    _request, deployment, secret = deployed

    assert_stays_under_v1(relaying_web_server, deployment.slug, secret)
