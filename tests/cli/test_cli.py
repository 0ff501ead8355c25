"""`cc`, the command line (cli/), driven in-process with Click's runner against a live server with the API tests'
fixtures: a developer logs in with a personal token, previews and orders from YAML, follows the request to active,
reaches it by ssh and VS Code link, reads its usage and releases it; refusals end with the API's {code, message}
and the documented exit codes."""

import json
import os
import stat
import subprocess
from datetime import timedelta

import pytest
from click.testing import CliRunner
from computecatalog_cli import main as cc
from computecatalog_cli.client import Exit
from django.utils import timezone

from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling import cycle
from tenancy.device_flow import device_authorization_decide
from tenancy.models import ApiToken, DeviceAuthorization
from tests import factories
from tests.provisioning.conftest import add_node
from tests.requests.conftest import shop, team  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


@pytest.fixture
def terminal(live_server, tmp_path, monkeypatch):
    """Runs `cc ARGS` against the live server, with its config file in the test's own directory."""
    monkeypatch.setenv("CC_CONFIG", str(tmp_path / "cc" / "config.json"))
    for variable in ("CC_SERVER", "CC_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    runner = CliRunner()

    def run(*args, expect=Exit.OK):
        result = runner.invoke(cc.cli, ["--server", live_server.url, *args], catch_exceptions=False)
        assert result.exit_code == expect, (args, result.output, result.stderr)
        return result

    run.config = tmp_path / "cc" / "config.json"
    run.server = live_server.url
    return run


def _json(result):
    return json.loads(result.stdout)


def _order_file(tmp_path, shop, project, **overrides):  # noqa: F811
    path = tmp_path / "order.yaml"
    fields = {
        "service": shop.service.pk,
        "project": project.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
        "justification": "fine-tuning run",
        **overrides,
    }
    path.write_text("".join(f"{key}: {value}\n" for key, value in fields.items()))
    return path


def test_from_login_to_release_with_the_terminal_only(terminal, shop, team, tmp_path, monkeypatch):  # noqa: F811
    terminal("login", "--token", factories.token_for(team.developer))
    assert stat.S_IMODE(os.stat(terminal.config).st_mode) == 0o600
    assert factories.token_for.__name__ not in terminal.config.read_text()

    services = _json(terminal("catalog", "--vendor", "nvidia", "--json"))
    assert [spec["id"] for spec in services[0]["specs"]] == [shop.whole.pk, shop.sliced.pk]
    fitting = _json(terminal("catalog", "--fits", str(team.project.pk), "--json"))
    assert {spec["id"] for spec in fitting[0]["specs"]} == {shop.whole.pk, shop.sliced.pk}
    assert _json(terminal("catalog", "--vendor", "amd", "--json")) == []
    assert shop.whole.name in terminal("catalog").stdout

    order = _order_file(tmp_path, shop, team.project)
    preview = _json(terminal("order", "-f", str(order), "--preview", "--json"))
    assert preview["cost"]["total"] == "80.00" and preview["fits_quota"] is True
    shown = terminal("order", "-f", str(order), "--preview").stdout
    assert "Cost: 80.00" in shown and "Approval:" in shown and "Fits now: no" in shown  # no node yet
    assert not ResourceRequest.objects.exists()  # a preview stores nothing

    ordered = _json(terminal("order", "-f", str(order), "--json"))
    request_id = ordered["id"]
    assert ordered["state"] == RequestState.QUEUED
    assert str(request_id) in terminal("ls").stdout
    queued = terminal("status", str(request_id)).stdout
    reason = ResourceRequest.objects.get(pk=request_id).queue_reason
    assert f"Request {request_id}: Queued" in queued and f"{reason['code']}: {reason['message']}" in queued

    add_node(shop.accelerator)
    cycle.run_cycle()  # the scheduler's next cycle places it; provisioning (inline in tests) delivers it
    watched = terminal("status", str(request_id), "--watch", "--interval", "0.1")
    assert "Active (active)" in watched.stdout and "connect: ssh -p" in watched.stdout
    detail = _json(terminal("status", str(request_id), "--json"))
    delivered = detail["provisioning"]["delivered"]
    user, host, port = delivered["user"], delivered["host"], delivered["ports"]["ssh"]
    assert user == team.developer.username
    assert detail["usage"]["currency"] == detail["currency"]

    executed = []
    monkeypatch.setattr(cc.os, "execvp", lambda program, argv: executed.append(argv))
    terminal("ssh", str(request_id), "--", "nvidia-smi")
    assert executed == [["ssh", "-p", str(port), f"{user}@{host}", "nvidia-smi"]]
    linked = terminal("code", str(request_id))
    assert linked.stdout.strip() == f"vscode://vscode-remote/ssh-remote+{user}@{host}:{port}/home/{user}"
    assert f"Host cc-{request_id}\n  HostName {host}\n  Port {port}\n  User {user}" in linked.stderr
    assert "jetbrains-gateway://connect#type=ssh" in linked.stderr
    links = _json(terminal("code", str(request_id), "--json"))
    assert links == delivered["ide"] and set(links) == {"ssh_argv", "ssh_config", "vscode", "jetbrains_gateway"}

    usage = _json(terminal("usage", "--project", str(team.project.pk), "--json"))
    assert [row["project"] for row in usage["results"]] == [team.project.slug]

    released = _json(terminal("release", str(request_id), "--reason", "done", "--json"))
    assert released["state"] in (RequestState.RELEASING, RequestState.RELEASED)
    refused = terminal("cancel", str(request_id), "--json", expect=Exit.REFUSED)
    assert json.loads(refused.stderr)["code"]  # the API's own code, e.g. invalid_transition
    gone = terminal("ssh", str(request_id), expect=Exit.REFUSED)
    assert "not_reachable_by_ssh" in gone.stderr


def test_refusals_end_with_the_apis_code_and_the_documented_exit_code(terminal, shop, team, tmp_path):  # noqa: F811
    terminal("status", "1", expect=Exit.NOT_FOUND_OR_AUTH)  # not signed in yet
    terminal("login", "--token", "cct_not-a-real-token", expect=Exit.NOT_FOUND_OR_AUTH)
    assert not terminal.config.exists()  # a token that does not work is not kept

    terminal("login", "--token", factories.token_for(team.developer))
    too_long = _order_file(tmp_path, shop, team.project, duration_hours=100000)
    refused = terminal("order", "-f", str(too_long), expect=Exit.REFUSED)
    assert "error " in refused.stderr and "duration" in refused.stderr
    body = json.loads(terminal("order", "-f", str(too_long), "--json", expect=Exit.REFUSED).stderr)
    assert set(body) == {"code", "message", "details"}
    assert not ResourceRequest.objects.exists()

    terminal("order", "-f", str(tmp_path / "missing.yaml"), expect=Exit.USAGE)
    terminal("status", "not-a-number", expect=Exit.USAGE)
    missing = terminal("status", "999999", "--json", expect=Exit.NOT_FOUND_OR_AUTH)
    assert json.loads(missing.stderr)["code"] == "not_found"

    request_id = _json(terminal("order", "-f", str(_order_file(tmp_path, shop, team.project)), "--json"))["id"]
    assert "Cancelled" in terminal("cancel", str(request_id), "--reason", "wrong spec").stdout
    ended = terminal("status", str(request_id), "--watch", "--interval", "0.1", expect=Exit.DID_NOT_START)
    assert f"Request {request_id}: Cancelled" in ended.stdout


def test_another_tenants_developer_sees_nothing_and_a_narrow_token_is_refused(terminal, shop, team, tmp_path):  # noqa: F811
    terminal("login", "--token", factories.token_for(team.developer))
    request_id = _json(terminal("order", "-f", str(_order_file(tmp_path, shop, team.project)), "--json"))["id"]

    outsider = factories.member(factories.project())
    terminal("login", "--token", factories.token_for(outsider))
    assert _json(terminal("ls", "--json")) == []
    terminal("status", str(request_id), expect=Exit.NOT_FOUND_OR_AUTH)
    terminal("cancel", str(request_id), expect=Exit.NOT_FOUND_OR_AUTH)

    reader = factories.token_for(team.developer, scopes=["requests:read"])
    terminal("login", "--token", reader)  # narrowed away from projects, it still signs in
    assert _json(terminal("ls", "--json"))[0]["id"] == request_id
    narrow = json.loads(terminal("cancel", str(request_id), "--json", expect=Exit.NOT_FOUND_OR_AUTH).stderr)
    assert narrow["code"] == "token_scope"
    assert ResourceRequest.objects.get(pk=request_id).state == RequestState.QUEUED


def test_serving_keys_are_listed_made_once_and_revoked(terminal, team):  # noqa: F811
    terminal("login", "--token", factories.token_for(team.developer))
    project = str(team.project.pk)
    made = _json(terminal("keys", "create", project, "--name", "notebook", "--json"))
    assert made["key"] and made["name"] == "notebook"
    listed = _json(terminal("keys", "ls", project, "--json"))
    assert [key["prefix"] for key in listed] == [made["prefix"]] and "key" not in listed[0]
    assert made["key"] not in terminal("keys", "ls", project).stdout
    terminal("keys", "revoke", str(made["id"]))
    assert _json(terminal("keys", "ls", project, "--json"))[0]["active"] is False


def test_ssh_keys_are_added_listed_and_removed_from_the_terminal(terminal, team, tmp_path):  # noqa: F811
    terminal("login", "--token", factories.token_for(team.developer))
    private = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", private], check=True)
    added = _json(terminal("keys", "ssh", "add", "laptop", str(private.with_suffix(".pub")), "--json"))
    assert added["name"] == "laptop" and added["fingerprint"].startswith("SHA256:")
    assert [key["name"] for key in _json(terminal("keys", "ssh", "ls", "--json"))] == ["laptop"]

    refused = terminal("keys", "ssh", "add", "oops", str(private), "--json", expect=Exit.REFUSED)
    assert json.loads(refused.stderr)["code"] == "ssh_key_invalid"  # the private key is refused and not kept
    assert "BEGIN" not in refused.stderr

    terminal("keys", "ssh", "rm", str(added["id"]))
    assert _json(terminal("keys", "ssh", "ls", "--json")) == []
    terminal("keys", "ssh", "rm", str(added["id"]), expect=Exit.NOT_FOUND_OR_AUTH)


def test_a_queued_request_shows_its_expected_start_in_status_ls_preview_and_watch(
    terminal,
    shop,  # noqa: F811
    team,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    # The table's sentences on one line each: the console took its width (COLUMNS, else 80) when the CLI was imported,
    # and wider ids and names from earlier tests of the process would squeeze the last column into two lines.
    monkeypatch.setattr(cc.out, "_width", 400)
    terminal("login", "--token", factories.token_for(team.developer))
    add_node(shop.accelerator, cards=2)
    order = _order_file(tmp_path, shop, team.project)
    running = _json(terminal("order", "-f", str(order), "--json"))["id"]
    waiting = _json(terminal("order", "-f", str(order), "--json"))["id"]
    cycle.run_cycle()  # the first takes both cards for its 10 hours; the second waits for their end

    expected = _json(terminal("status", str(waiting), "--json"))["queue"]["expected_start"]
    assert expected["message"] == "Expected to start in about 10 h." and expected["likely"]
    shown = terminal("status", str(waiting)).stdout
    assert "  expected start: Expected to start in about 10 h. Likely at " in shown
    table = [[cell.strip() for cell in line.split("│")[1:-1]] for line in terminal("ls").stdout.splitlines()]
    rows = {cells[0]: cells for cells in table if cells}
    assert rows[str(waiting)][-1].startswith("Expected to start in about 10 h.") and rows[str(running)][-1] == "-"
    preview = terminal("order", "-f", str(order), "--preview").stdout
    assert "Fits now: no" in preview and "Expected start: Expected to start in about" in preview
    watched = terminal(
        "status", str(waiting), "--watch", "--interval", "0.1", "--timeout", "0.3", expect=Exit.DID_NOT_START
    )
    assert "expected start: Expected to start in about 10 h." in watched.stdout  # followed while it waits


def test_without_company_sign_in_login_asks_for_a_token_and_usage_shows_idle_card_hours(terminal, team):  # noqa: F811
    secret = factories.token_for(team.developer)
    runner = CliRunner()
    signed_in = runner.invoke(
        cc.cli, ["--server", terminal.server, "login"], input=f"{secret}\n", catch_exceptions=False
    )
    assert signed_in.exit_code == 0, signed_in.output
    assert "/account/api-tokens/ and paste it here" in signed_in.stderr and secret not in signed_in.output
    idle = _json(terminal("usage", "--idle", "--project", str(team.project.pk), "--json"))
    assert set(idle) == {"projects", "requests"}
    assert "held card-hours" in terminal("usage", "--idle").stdout


@pytest.fixture
def polls(monkeypatch, settings):
    """Company sign-in on, and the CLI's waits between device-flow polls noted instead of slept; `then[n]` runs at
    the n-th wait (what the person does on the portal meanwhile)."""
    settings.OIDC_ENABLED = True
    waits, then = [], {}

    def wait(seconds):
        waits.append(seconds)
        if len(waits) in then:
            then[len(waits)]()

    monkeypatch.setattr(cc, "wait_between_polls", wait)
    return waits, then


def _decide(person, approve: bool):
    device_authorization_decide(authorization=DeviceAuthorization.objects.get(), approve=approve, actor=person)
    DeviceAuthorization.objects.update(last_polled_at=timezone.now() - timedelta(minutes=5))  # the interval passed


def test_device_login_polls_at_the_interval_slows_down_when_told_and_keeps_the_token(terminal, team, polls):  # noqa: F811
    waits, then = polls
    then[3] = lambda: _decide(team.developer, approve=True)

    signed_in = terminal("login", "--scope", "requests:read", "--scope", "projects:read", "--days", "7")

    # Polled at 5 s; the second poll came at once (the wait was not slept), so the server slowed it to 10 s.
    assert waits == [5, 5, 10]
    assert "enter the code" in signed_in.stderr and "/device/?user_code=" in signed_in.stderr
    token = ApiToken.objects.get(user=team.developer)
    assert token.scopes == ["projects:read", "requests:read"] and token.expires_at > timezone.now() + timedelta(days=6)
    assert _json(terminal("ls", "--json")) == []  # the kept token works (and may read requests)


def test_device_login_ends_with_exit_code_1_when_the_code_is_denied(terminal, team, polls):  # noqa: F811
    waits, then = polls
    then[1] = lambda: _decide(team.developer, approve=False)

    denied = terminal("login", "--json", expect=Exit.REFUSED)

    assert json.loads(denied.stderr.splitlines()[-1])["code"] == "access_denied"  # after the address and code
    assert not terminal.config.exists() and not ApiToken.objects.exists()
    assert waits == [5]  # one wait, then the answer
