"""Issue 37 item 7: an order's ssh_public_key is checked when the order is made with the rule the container backend
applies where it installs the key (catalog.parameters.ssh_public_key_problem): what one accepts, the other accepts.
Before, the order took any text and the start took some keys that are none (a type the key does not hold, a bare
"AAAA", a carriage return in the comment)."""

import subprocess

import pytest

from provisioning.drivers.base import StepError, Target
from provisioning.drivers.container import ContainerWorkloads
from requests.models import ResourceRequest
from tests.provisioning.test_order_inputs import declare, order_body

pytestmark = pytest.mark.django_db

SSH_KEY_ENTRY = {"name": "ssh_public_key", "type": "string", "max_length": 1000}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, str]:
    """Real public keys from ssh-keygen, by type."""
    made = {}
    for kind in ("ed25519", "ecdsa", "rsa"):
        path = tmp_path_factory.mktemp(kind) / "key"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "dev@laptop", "-f", str(path)], check=True)
        made[kind] = path.with_suffix(".pub").read_text().strip()
    return made


def _samples(keys: dict[str, str]) -> list[tuple[str, str, bool]]:
    ed25519, ecdsa, rsa = keys["ed25519"], keys["ecdsa"], keys["rsa"]
    kind, blob, _comment = ed25519.split(" ", 2)
    return [
        ("ed25519 with a comment", ed25519, True),
        ("ecdsa without a comment", " ".join(ecdsa.split(" ")[:2]), True),
        ("rsa, surrounded by blanks", f"  {rsa}\n", True),
        ("a type the key does not hold", f"ssh-rsa {blob} dev@laptop", False),
        ("a second line", f"{ed25519}\n{rsa}", False),
        ("a carriage return in the comment", f"{kind} {blob} dev\r@laptop", False),
        ("authorized_keys options", f'command="/bin/sh" {ed25519}', False),
        ("base64 that holds no key", f"{kind} AAAA", False),
        ("an unknown type", f"ssh-foo {blob}", False),
        ("no key at all", "my key", False),
    ]


def _accepted_at_order(api_as, compute, key: str) -> bool:
    shop, team = compute.shop, compute.team
    response = api_as(team.developer).post(
        "/api/v1/requests/preview/", order_body(shop, team.project, ssh_public_key=key), format="json"
    )
    if response.status_code == 200:
        return True
    body = response.json()
    assert (response.status_code, body["code"], body["details"]["rule"]) == (422, "parameter_invalid", "ssh_public_key")
    assert body["message"].startswith("ssh_public_key ")
    return False


def _accepted_at_start(key: str, settings) -> bool:
    """Whether the container backend's start gets past the key: it then asks podman, here one that is not there."""
    settings.CONTAINER_PODMAN_URL = "unix:///nonexistent/podman.sock"
    target = Target(
        run_id=1,
        request_id=1,
        node="node-1",
        devices=({"index": 0, "uuid": "GPU-0", "model": "H100", "model_slug": "h100", "milli": 1000},),
        snapshot={"parameters": {"ssh_public_key": key, "jupyter": False}, "demand": {"cpu_cores": 1, "memory_gb": 1}},
        requester="dev",
    )
    with pytest.raises(StepError) as failure:
        ContainerWorkloads().start_workload(target, {"reference": "localhost/workspace:1", "name": "w", "version": "1"})
    if failure.value.code.startswith("ssh_public_key"):
        assert (failure.value.code, failure.value.retryable) == ("ssh_public_key_invalid", False)
        return False
    assert failure.value.code.startswith("podman"), failure.value.message
    return True


def test_the_order_and_the_workspace_start_accept_the_same_keys(compute, api_as, keys, settings):
    declare(compute.shop.service, SSH_KEY_ENTRY)
    verdicts = {
        name: (expected, _accepted_at_order(api_as, compute, key), _accepted_at_start(key, settings))
        for name, key, expected in _samples(keys)
    }

    assert verdicts == {name: (expected, expected, expected) for name, (expected, _, _) in verdicts.items()}


def test_a_refused_key_stores_nothing_and_an_accepted_one_is_stored_as_one_line(compute, api_as, keys):
    shop, team = compute.shop, compute.team
    declare(shop.service, SSH_KEY_ENTRY)
    client = api_as(team.developer)

    refused = client.post(
        "/api/v1/requests/",
        order_body(shop, team.project, ssh_public_key=f"{keys['ed25519']}\nrm -rf ~"),
        format="json",
    )
    accepted = client.post(
        "/api/v1/requests/", order_body(shop, team.project, ssh_public_key=f" {keys['ed25519']}\n"), format="json"
    )

    assert refused.status_code == 422 and accepted.status_code == 201, (refused.content, accepted.content)
    assert list(ResourceRequest.objects.values_list("parameters__ssh_public_key", flat=True)) == [keys["ed25519"]]
