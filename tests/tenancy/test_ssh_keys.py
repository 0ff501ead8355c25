"""SSH keys on a person's profile (issue 40 item 2): checked when added (a private key and junk are refused with
{code, message, details}), each person's own only (role matrix over the API and the page), audited; a container
workspace starts with the requester's keys, so an order needs no key pasted."""

import subprocess

import pytest
from django.urls import reverse

from provisioning.drivers.base import StepError, Target
from provisioning.drivers.container import ContainerWorkloads
from tenancy.models import AuditEvent, SshKey
from tenancy.ssh_keys import ssh_key_add
from tests import factories

pytestmark = pytest.mark.django_db
API = "/api/v1/ssh-keys/"
PAGE = "/account/ssh-keys/"
ROLES = ("developer", "other_developer", "approver", "lead", "operator")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """Real key pairs from ssh-keygen: public lines, fingerprints as ssh-keygen -l prints them, one private key."""
    keys = {}
    for kind in ("ed25519", "ecdsa", "rsa"):
        path = tmp_path_factory.mktemp(kind) / "key"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"{kind}@laptop", "-f", path], check=True)
        listed = subprocess.run(["ssh-keygen", "-l", "-f", path], check=True, capture_output=True, text=True).stdout
        keys[kind] = (path.with_suffix(".pub").read_text().strip(), listed.split()[1])
        keys[f"{kind}_private"] = path.read_text()
    return keys


def _add(client, name, key):
    return client.post(API, {"name": name, "public_key": key}, format="json")


def test_the_role_matrix_everyone_keeps_their_own_keys_and_sees_no_one_elses(api, api_as, roles, made):
    assert api.get(API).status_code == 401  # anonymous
    assert _add(api, "laptop", made["ed25519"][0]).status_code == 401
    for number, role in enumerate(ROLES):
        user = getattr(roles, role)
        ssh_key_add(user=user, name=f"machine {number}", public_key=made["ed25519"][0], actor=user)
    mine = SshKey.objects.get(user=roles.developer)
    for number, role in enumerate(ROLES):
        listed = api_as(getattr(roles, role)).get(API)
        assert listed.status_code == 200, role
        assert [key["name"] for key in listed.json()] == [f"machine {number}"], role
        if role != "developer":
            refused = api.delete(f"{API}{mine.pk}/")
            assert refused.status_code == 404 and refused.json()["code"] == "ssh_key_not_found", role
    assert SshKey.objects.filter(pk=mine.pk).exists()


def test_a_key_is_checked_fingerprinted_audited_and_removed_by_its_owner(api_as, roles, made):
    client = api_as(roles.developer)
    line, fingerprint = made["ed25519"]
    added = _add(client, "work laptop", f"  {line}\n")
    assert added.status_code == 201, added.content
    body = added.json()
    assert (body["public_key"], body["fingerprint"], body["key_type"]) == (line, fingerprint, "ssh-ed25519")
    rsa = _add(client, "home", made["rsa"][0]).json()
    assert rsa["fingerprint"] == made["rsa"][1]
    assert [key["name"] for key in client.get(API).json()] == ["home", "work laptop"]

    again = _add(client, "same key, other name", line)
    assert again.status_code == 409 and again.json()["details"]["field"] == "public_key"
    renamed = _add(client, "work laptop", made["ecdsa"][0])
    assert renamed.status_code == 409 and renamed.json()["code"] == "ssh_key_exists"

    assert client.delete(f"{API}{body['id']}/").status_code == 204
    assert client.delete(f"{API}{body['id']}/").status_code == 404
    assert client.delete(f"{API}{2**64}/").status_code == 404  # past the ids a database holds: none such, never a 500
    actions = list(AuditEvent.objects.order_by("id").values_list("action", "data__fingerprint"))
    assert actions[-3:] == [
        ("ssh_key.added", fingerprint),
        ("ssh_key.added", made["rsa"][1]),
        ("ssh_key.removed", fingerprint),
    ]


@pytest.mark.parametrize(
    "sample",
    ["private key", "two keys", "options", "junk", "not base64 of a key", "type it does not hold", "empty"],
)
def test_private_keys_and_junk_are_refused_with_code_message_and_field_and_never_echoed(api_as, roles, made, sample):
    line = made["ed25519"][0]
    kind, blob, _ = line.split(" ", 2)
    text = {
        "private key": made["ed25519_private"],
        "two keys": f"{line}\n{made['rsa'][0]}",
        "options": f'command="/bin/sh" {line}',
        "junk": "my key, trust me",
        "not base64 of a key": f"{kind} AAAA",
        "type it does not hold": f"ssh-rsa {blob}",
        "empty": "",
    }[sample]
    refused = _add(api_as(roles.developer), "laptop", text)
    body = refused.json()
    assert refused.status_code in (400, 422), body
    assert set(body) == {"code", "message", "details"}
    if sample != "empty":  # the serializer refuses a blank field before the rule
        assert (refused.status_code, body["code"], body["details"]["field"]) == (422, "ssh_key_invalid", "public_key")
    if sample == "private key":
        assert "private key" in body["message"] and "PRIVATE" not in body["message"]
    assert not SshKey.objects.exists()


def test_a_read_only_token_lists_keys_but_may_not_add_them(api_as, roles, made):
    client = api_as(roles.developer)
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.token_for(roles.developer, scopes=['requests:read'])}")
    assert client.get(API).status_code == 200
    refused = _add(client, "laptop", made["ed25519"][0])
    assert refused.status_code == 403 and refused.json()["code"] == "token_scope"


def test_the_page_adds_and_removes_ones_own_keys(client, roles, made, django_assert_max_num_queries):
    assert client.get(PAGE).status_code == 302  # anonymous: to sign in
    for role in ROLES:
        client.force_login(getattr(roles, role))
        with django_assert_max_num_queries(10):
            assert client.get(PAGE).status_code == 200, role
    client.force_login(roles.developer)
    line, fingerprint = made["ed25519"]
    assert client.post(PAGE, {"name": "laptop", "public_key": line}).status_code == 302
    page = client.get(PAGE).content.decode()
    assert f'data-fingerprint="{fingerprint}"' in page and "laptop" in page
    refused = client.post(PAGE, {"name": "other", "public_key": made["rsa_private"]})
    assert refused.status_code == 422 and "is a private key" in refused.content.decode()
    assert "BEGIN OPENSSH" not in refused.content.decode().split('id="ssh-key-add"')[0]

    key = SshKey.objects.get(user=roles.developer)
    remove = reverse("team:ssh-key-remove", args=[key.pk])
    client.force_login(roles.lead)
    assert client.post(remove).status_code == 404
    client.force_login(roles.developer)
    assert client.post(remove).status_code == 302 and not SshKey.objects.exists()


def _target(requester: str, ordered_key: str = "") -> Target:
    return Target(
        run_id=1,
        request_id=1,
        node="node-1",
        devices=({"index": 0, "uuid": "GPU-0", "model": "H100", "model_slug": "h100", "milli": 1000},),
        snapshot={
            "parameters": {"ssh_public_key": ordered_key} if ordered_key else {},
            "demand": {"cpu_cores": 1, "memory_gb": 1},
        },
        requester=requester,
    )


def _authorized(target: Target) -> list[str]:
    options = ContainerWorkloads()._run_options(target, {"reference": "localhost/workspace:1"}, leader_address="")
    [value] = [option for option in options if option.startswith("WORKSPACE_AUTHORIZED_KEY=")]
    return value.removeprefix("WORKSPACE_AUTHORIZED_KEY=").split("\n")


def test_a_workspace_starts_with_the_requesters_profile_keys_and_the_orders_own(roles, made):
    developer = roles.developer
    with pytest.raises(StepError) as missing:
        _authorized(_target(developer.username))
    assert (missing.value.code, missing.value.retryable) == ("ssh_public_key_missing", False)

    ssh_key_add(user=developer, name="laptop", public_key=made["ed25519"][0], actor=developer)
    ssh_key_add(user=developer, name="desktop", public_key=made["rsa"][0], actor=developer)
    ssh_key_add(user=roles.lead, name="lead's", public_key=made["ecdsa"][0], actor=roles.lead)
    assert _authorized(_target(developer.username)) == [made["ed25519"][0], made["rsa"][0]]  # no key pasted
    pasted = made["ecdsa"][0]
    assert _authorized(_target(developer.username, pasted)) == [pasted, made["ed25519"][0], made["rsa"][0]]
    with pytest.raises(StepError) as invalid:
        _authorized(_target(developer.username, "ssh-ed25519 AAAA"))
    assert invalid.value.code == "ssh_public_key_invalid"


def test_the_list_reads_a_constant_number_of_queries(api_as, roles, made, django_assert_max_num_queries):
    client = api_as(roles.developer)
    for number, kind in enumerate(("ed25519", "ecdsa", "rsa")):
        ssh_key_add(user=roles.developer, name=f"key {number}", public_key=made[kind][0], actor=roles.developer)
    with django_assert_max_num_queries(3):  # the token and its user, the keys
        listed = client.get(API)
    assert len(listed.json()) == 3
