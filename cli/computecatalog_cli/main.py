"""`cc`: order, follow, connect to and release compute from a terminal. Every command takes --json (the API's own
answer, for scripts); exit codes are client.Exit's. Errors print the API's {code, message}."""

import functools
import json
import os
import socket
import sys
import time
import uuid
import webbrowser
from datetime import date, datetime
from pathlib import Path

import click
import yaml
from rich.console import Console
from rich.table import Table

from computecatalog_cli.client import Api, ApiError, Exit
from computecatalog_cli.config import Settings, settings_load, settings_save

# Where a watched request stops being followed: it runs, or it ended without running.
ARRIVED = frozenset({"active"})
ENDED = frozenset({"failed", "rejected", "cancelled", "releasing", "released"})
TOKENS_PAGE = "/account/api-tokens/"
IDLE_FIGURES = ("card_hours", "used_card_hours", "idle_card_hours")
DEVICE_GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"

out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)


class Context:
    def __init__(self, server: str | None):
        self.settings = settings_load()
        self.server = (server or self.settings.server or "").rstrip("/")
        self.as_json = False

    def api(self) -> Api:
        if not self.server:
            raise click.UsageError("No server: run `cc login --server URL` or set CC_SERVER.")
        if not self.settings.token:
            raise ApiError(401, "not_signed_in", "Not signed in: run `cc login`.")
        return self.client(self.settings.token)

    def client(self, token: str | None) -> Api:
        """An API client for this command, closed when the command ends."""
        api = Api(self.server, token)
        click.get_current_context().call_on_close(api.close)
        return api


def command(group=None, **options):
    """A command of `group` (the top level by default) with --json, whose ApiErrors end the run with the API's
    {code, message} and their exit code."""

    def decorate(function):
        @(group or cli).command(**options)
        @click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
        @click.pass_obj
        @functools.wraps(function)
        def run(context: Context, *args, as_json: bool, **kwargs):
            context.as_json = as_json
            try:
                return function(context, *args, **kwargs)
            except ApiError as error:
                _fail(context, error)

        return run

    return decorate


def _fail(context: Context, error: ApiError):
    if context.as_json:
        click.echo(json.dumps(error.body()), err=True)
    else:
        err.print(f"[red]error[/red] {error.code}: {error.message}", markup=True)
        if error.details:
            err.print(json.dumps(error.details, indent=2), markup=False)
    sys.exit(error.exit_code)


def _print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


@click.group()
@click.option("--server", envvar="CC_SERVER", help="The portal's address, e.g. https://compute.example.org.")
@click.version_option(package_name="computecatalog-cli")
@click.pass_context
def cli(click_context, server):
    """The Compute Catalog from a terminal. Exit codes: 0 ok, 1 the API refused, 2 usage error, 3 not signed in,
    not allowed or not found, 4 server unreachable or failing, 5 a watched request ended without running."""
    click_context.obj = Context(server)


# --- signing in ------------------------------------------------------------------------------------------------


@command(
    help="Sign in: with company sign-in, approve a code on the portal (OAuth device flow); otherwise paste a "
    "personal API token made on the portal's API tokens page."
)
@click.option("--token", help="A token made on the API tokens page; asked for (hidden) when the server has no SSO.")
@click.option("--scope", "scopes", multiple=True, help="A scope the token asks for (repeat); default: the portal's.")
@click.option("--days", type=click.IntRange(min=1), help="The token's lifetime in days; default: the portal's.")
def login(context: Context, token: str | None, scopes: tuple[str, ...], days: int | None):
    if not context.server:
        raise click.UsageError("Name the server: cc --server URL login.")
    if not token:
        token = _token_by_device_sign_in(context, scopes, days)
    if not token:
        err.print(f"Make a token at {context.server}{TOKENS_PAGE} and paste it here.")
        token = click.prompt("Token", hide_input=True).strip()
    api = context.client(token)
    try:
        projects = api.all_pages("projects/")  # proves the token works before it is kept
    except ApiError as error:
        if error.code != "token_scope":  # a token narrowed away from projects still signs in
            raise
        projects = []
    path = settings_save(Settings(server=context.server, token=token))
    if context.as_json:
        _print_json({"server": context.server, "config": str(path), "projects": [p["slug"] for p in projects]})
    else:
        out.print(f"Signed in to {context.server}; token kept in {path} (readable by you only).")


def _token_by_device_sign_in(context: Context, scopes: tuple[str, ...], days: int | None) -> str | None:
    """The OAuth 2.0 device authorization grant (RFC 8628): print the portal's address and a code, poll at the
    interval the server gives until the person approves or denies it there. None when the server has no company
    sign-in (it answers device_flow_off): then a token is pasted."""
    api = context.client(None)
    asked = {"client_id": "cc", "name": f"cc on {socket.gethostname()}"[:80]}
    if scopes:
        asked["scope"] = " ".join(scopes)
    if days:
        asked["expires_in_days"] = days
    try:
        started = api.post("auth/device/", asked)
    except ApiError as error:
        if error.code == "device_flow_off":
            return None
        raise
    # Plain lines, never wrapped: the address must stay whole to be copied.
    click.echo(f"Open {started['verification_uri']} and enter the code {started['user_code']}", err=True)
    click.echo(f"(or open {started['verification_uri_complete']}); waiting for you to approve it...", err=True)
    return _poll_for_token(api, started)


def wait_between_polls(seconds: float) -> None:
    """The device flow's wait between polls (its own name, so tests can stand in for the clock)."""
    time.sleep(seconds)


def _poll_for_token(api: Api, started: dict) -> str:
    interval, deadline = started["interval"], time.monotonic() + started["expires_in"]
    poll = {"grant_type": DEVICE_GRANT_TYPE, "device_code": started["device_code"], "client_id": "cc"}
    while time.monotonic() < deadline:
        wait_between_polls(interval)
        try:
            return api.post("auth/device/token/", poll)["access_token"]
        except ApiError as error:
            if error.code == "slow_down":  # RFC 8628 3.5: wait longer from now on
                interval = (error.details or {}).get("interval") or interval + 5
            elif error.code == "throttled":
                interval += (error.details or {}).get("retry_after_seconds") or 5
            elif error.code != "authorization_pending":
                raise
    raise ApiError(400, "expired_token", "The code expired before it was approved; run `cc login` again.")


# --- the catalog and orders -------------------------------------------------------------------------------------


def _remaining(project: dict) -> dict:
    """What the project may still take per quota dimension (None: no limit)."""
    usage = project.get("usage") or {}
    return {
        dimension: None if limit is None else float(limit) - float(usage.get(dimension) or 0)
        for dimension, limit in (project.get("quota") or {}).items()
    }


def _fits(spec: dict, remaining: dict) -> bool:
    demand = {
        "gpus": spec.get("gpu_equivalents"),
        "accelerator_memory_gb": spec.get("accelerator_memory_gb"),
        "cpu_cores": spec.get("cpu_cores"),
        "memory_gb": spec.get("memory_gb"),
    }
    return all(
        remaining.get(dimension) is None or float(needed or 0) <= remaining[dimension]
        for dimension, needed in demand.items()
    )


@command(help="Services and their specs (ids for order.yaml).")
@click.option("--vendor", help="Only offers with this accelerator vendor (slug, e.g. nvidia).")
@click.option("--fits", "fits_project", type=int, help="Only specs that fit this project's remaining quota (id).")
def catalog(context: Context, vendor: str | None, fits_project: int | None):
    api = context.api()
    services = [api.get(f"catalog/services/{row['id']}/") for row in api.all_pages("catalog/services/", vendor=vendor)]
    if fits_project is not None:
        remaining = _remaining(api.get(f"projects/{fits_project}/"))
        for service in services:
            service["specs"] = [spec for spec in service["specs"] if _fits(spec, remaining)]
    if vendor:
        for service in services:
            service["specs"] = [
                spec for spec in service["specs"] if any(m["vendor"] == vendor for m in spec["accelerator_models"])
            ]
    if context.as_json:
        return _print_json(services)
    table = Table("service", "kind", "spec id", "spec", "cards", "per hour", "images")
    for service in services:
        images = ", ".join(f"{image['id']}={image['name']}" for image in service["images"]) or "-"
        for spec in service["specs"] or [None]:
            table.add_row(
                f"{service['id']} {service['name']}",
                service["kind"],
                str(spec["id"]) if spec else "-",
                spec["name"] if spec else "-",
                str(spec["accelerator_count"]) if spec else "-",
                f"{spec['hourly_cost']} {spec['currency']}" if spec else "-",
                images,
            )
    out.print(table)


def _order_body(path: str) -> dict:
    try:
        body = yaml.safe_load(Path(path).read_text()) if path != "-" else yaml.safe_load(sys.stdin)
    except (OSError, yaml.YAMLError) as error:
        raise click.UsageError(f"Cannot read the order {path}: {error}") from error
    if not isinstance(body, dict):
        raise click.UsageError(f"{path} holds no order: a mapping of the API's order fields (service, project, ...).")
    return body


@command(help="Order from a YAML file of the API's order fields; --preview only says what it would cost and do.")
@click.option("-f", "--file", "path", required=True, help="order.yaml ('-': standard input).")
@click.option(
    "--preview", is_flag=True, help="Cost, quota impact, approval route, whether it fits now, expected start."
)
def order(context: Context, path: str, preview: bool):
    body, api = _order_body(path), context.api()
    if preview:
        answer = api.post("requests/preview/", body)
        return _print_json(answer) if context.as_json else _show_preview(answer)
    answer = api.post("requests/", body, headers={"Idempotency-Key": str(uuid.uuid4())})
    if context.as_json:
        return _print_json(answer)
    out.print(f"Request {answer['id']}: {answer['state_label']}. Follow it: cc status {answer['id']} --watch")


def _show_preview(preview: dict) -> None:
    cost = preview["cost"]
    out.print(preview["summary"])
    out.print(f"Cost: {cost['total']} {cost['currency']} ({cost['hourly']}/h x {cost['duration_hours']} h)")
    table = Table("quota", "dimension", "used", "this order", "limit", "fits")
    for line in preview["quota"]:
        table.add_row(
            line["scope"],
            line["label"],
            str(line.get("used")),
            str(line.get("requested")),
            str(line.get("limit")),
            "yes" if line["fits"] else "NO",
        )
    out.print(table)
    route = preview["approval_route"]
    out.print(f"Approval: {route['explanation']}")
    for stage in route.get("stages") or []:
        out.print(f"  {stage['order']}. {stage['name']}: {stage['who']}")
    placement = preview.get("placement")
    if placement is None:
        out.print("Fits now: not estimated yet")
        return
    if placement.get("fits_now"):
        out.print(f"Fits now: yes, on {placement.get('node')}")
    else:
        out.print(f"Fits now: no: {placement.get('message') or placement.get('code')}")
    start = _start_words(placement.get("expected_start"))
    if start:
        out.print(f"Expected start: {start}")


def _start_words(expected_start: dict | None) -> str | None:
    """The API's sentence for an expected start (said relative to when the server answered), with the likely time in
    the terminal's own time zone when there is one."""
    if not expected_start:
        return None
    likely = expected_start.get("likely")
    if not likely:
        return expected_start["message"]
    local = datetime.fromisoformat(likely).astimezone()
    return f"{expected_start['message']} Likely at {local:%Y-%m-%d %H:%M %Z}."


# --- following requests -------------------------------------------------------------------------------------------


@command(name="ls", help="Your requests (and those of your projects), newest first.")
@click.option("--state", help="Only requests in this state.")
@click.option("--project", type=int, help="Only this project's (id).")
def list_requests(context: Context, state: str | None, project: int | None):
    rows = context.api().all_pages("requests/", state=state, project=project, ordering="-created_at")
    if context.as_json:
        return _print_json(rows)
    table = Table("id", "state", "project", "offer", "hours", "cost", "requester", "expected start")
    for row in rows:
        offer = row.get("spec") or row.get("bare_metal_profile") or row.get("serving_model") or {}
        table.add_row(
            str(row["id"]),
            row["state"],
            row["project"]["slug"],
            offer.get("name", row["service"]["name"]),
            str(row["duration_hours"]),
            f"{row['cost_estimate']} {row['currency']}",
            row["requester"],
            _start_words((row.get("queue") or {}).get("expected_start")) or "-",
        )
    out.print(table)


def _status_lines(request: dict) -> list[str]:
    lines = [f"Request {request['id']}: {request['state_label']} ({request['state']})"]
    queue = request.get("queue")
    if queue:
        lines.append(f"  queue position {queue.get('position')}: {queue.get('code')}: {queue.get('message')}")
        if queue.get("numbers"):
            lines.append("  " + ", ".join(f"{key} {value}" for key, value in queue["numbers"].items()))
        start = _start_words(queue.get("expected_start"))
        if start:
            lines.append(f"  expected start: {start}")
    for run in (request.get("provisioning") or {}).get("runs") or []:
        steps = run.get("steps") or []
        done = sum(step.get("state") == "succeeded" for step in steps)
        lines.append(f"  {run.get('kind')} {run.get('state')}: {done}/{len(steps)} steps")
        lines += [f"    [{step.get('state')}] {step.get('name')}" for step in steps]
    usage = request.get("usage")
    if usage:
        tokens = usage["prompt_tokens"] + usage["completion_tokens"]
        lines.append(
            f"  so far: {usage['cost']} of the {usage['cost_approved']} {usage['currency']} approved for its whole "
            f"duration; {usage['card_hours']} card-hours, {usage['energy_kwh']} kWh"
            + (f", {usage['prompt_tokens']} + {usage['completion_tokens']} tokens" if tokens else "")
        )
    failure = request.get("failure")
    if failure:
        lines.append(f"  failed: {failure['code']}: {failure['sentence']}")
    ide = _ide_access(request)
    if ide:
        lines.append(f"  connect: {' '.join(ide['ssh_argv'])}   (cc ssh {request['id']}, cc code {request['id']})")
    return lines


@command(help="A request's state, queue reason with its numbers and expected start, provisioning steps, cost so far.")
@click.argument("request_id", type=int)
@click.option("--watch", is_flag=True, help="Follow it until it is active or has ended.")
@click.option("--interval", default=5.0, show_default=True, help="Seconds between looks while watching.")
@click.option("--timeout", default=3600.0, show_default=True, help="Stop watching after this many seconds.")
def status(context: Context, request_id: int, watch: bool, interval: float, timeout: float):
    api, deadline, shown = context.api(), time.monotonic() + timeout, None
    while True:
        request = api.get(f"requests/{request_id}/")
        lines = _status_lines(request)
        if context.as_json and not watch:
            return _print_json(request)
        if lines != shown and not context.as_json:
            out.print("\n".join(lines), markup=False)
            shown = lines
        state = request["state"]
        if not watch or state in ARRIVED:
            break
        if state in ENDED or time.monotonic() >= deadline:
            if context.as_json:
                _print_json(request)
            sys.exit(Exit.DID_NOT_START)
        time.sleep(interval)
    if context.as_json:
        _print_json(request)


def _ide_access(request: dict) -> dict | None:
    """The workspace's ssh command line, ssh_config block and IDE links, as the API gives them while it is active."""
    return (((request.get("provisioning") or {}).get("delivered")) or {}).get("ide")


def _reachable(context: Context, request_id: int) -> dict:
    request = context.api().get(f"requests/{request_id}/")
    ide = _ide_access(request)
    if ide is None:
        raise ApiError(
            409, "not_reachable_by_ssh", f"Request {request_id} is {request['state']}: no SSH workspace to reach."
        )
    return ide


@command(help="SSH into an active workspace (runs ssh with its host, port and account; args after -- go to ssh).")
@click.argument("request_id", type=int)
@click.argument("ssh_args", nargs=-1, type=click.UNPROCESSED)
def ssh(context: Context, request_id: int, ssh_args: tuple[str, ...]):
    ide = _reachable(context, request_id)
    if context.as_json:
        return _print_json(ide)
    argv = [*ide["ssh_argv"], *ssh_args]
    os.execvp(argv[0], argv)


@command(help="The workspace in VS Code (vscode:// link), with the ssh_config block and the JetBrains Gateway link.")
@click.argument("request_id", type=int)
@click.option("--open", "open_it", is_flag=True, help="Open the VS Code link with the desktop's handler.")
def code(context: Context, request_id: int, open_it: bool):
    ide = _reachable(context, request_id)
    if context.as_json:
        return _print_json(ide)
    out.print(ide["vscode"], markup=False)
    err.print(f"\nssh_config:\n{ide['ssh_config']}\nJetBrains Gateway: {ide['jetbrains_gateway']}", markup=False)
    if open_it:
        webbrowser.open(ide["vscode"])


def _act(context: Context, request_id: int, action: str, body: dict) -> None:
    answer = context.api().post(f"requests/{request_id}/{action}/", body)
    if context.as_json:
        return _print_json(answer)
    out.print(f"Request {answer['id']}: {answer['state_label']}.")


@command(help="Release an active request early: its devices go back to the pool.")
@click.argument("request_id", type=int)
@click.option("--reason", default="", help="Why (on the timeline).")
def release(context: Context, request_id: int, reason: str):
    _act(context, request_id, "release", {"reason": reason})


@command(help="Cancel a request that is not running yet.")
@click.argument("request_id", type=int)
@click.option("--reason", default="", help="Why (on the timeline).")
def cancel(context: Context, request_id: int, reason: str):
    _act(context, request_id, "cancel", {"reason": reason})


@command(help="Ask for more hours for a running request (approved by the same rules as an order).")
@click.argument("request_id", type=int)
@click.option("--hours", type=click.IntRange(min=1), required=True)
@click.option("--justification", required=True)
def extend(context: Context, request_id: int, hours: int, justification: str):
    _act(context, request_id, "extend", {"hours": hours, "justification": justification})


# --- usage and keys -----------------------------------------------------------------------------------------------


@command(help="Card-hours, cost and energy per project and month; --idle: held against used and idle card-hours.")
@click.option("--project", type=int, help="Only this project (id).")
@click.option("--month", help="YYYY-MM (default: this month).")
@click.option("--idle", is_flag=True, help="Card-hours held, used and idle, per project and request.")
def usage(context: Context, project: int | None, month: str | None, idle: bool):
    month = month or f"{date.today():%Y-%m}"
    path = "usage/idle/" if idle else "usage/"
    answer = context.api().get(path, project=project, **{"from": month, "to": month})
    if context.as_json:
        return _print_json(answer)
    if idle:
        return _show_idle(answer)
    table = Table("project", "month", "card-hours", "cost", "energy kWh")
    for row in answer["results"]:
        table.add_row(
            row.get("project", "-"),
            row.get("month", "-"),
            row["card_hours"],
            f"{row['cost']} {row['currency']}",
            f"{row['energy_kwh']:.2f}",
        )
    out.print(table)


def _show_idle(report: dict) -> None:
    table = Table("project", "request", "held card-hours", "used", "idle")
    for row in report["projects"]:
        table.add_row(row["project"], "all", *(str(row[key]) for key in IDLE_FIGURES))
    for row in report["requests"]:
        table.add_row(row["project"], str(row["request"]), *(str(row[key]) for key in IDLE_FIGURES))
    out.print(table)


@cli.group(help="A project's API keys for its serving endpoints.")
def keys():
    pass


@command(group=keys, name="ls", help="The project's serving API keys (never their secrets).")
@click.argument("project_id", type=int)
def keys_list(context: Context, project_id: int):
    rows = context.api().get(f"projects/{project_id}/api-keys/")
    if context.as_json:
        return _print_json(rows)
    table = Table("id", "name", "prefix", "active", "last used", "expires")
    for row in rows:
        table.add_row(
            str(row["id"]),
            row["name"],
            row["prefix"],
            "yes" if row["active"] else "no",
            row["last_used_at"] or "never",
            row["expires_at"] or "-",
        )
    out.print(table)


@command(group=keys, name="create", help="A new serving API key; its secret is printed this once.")
@click.argument("project_id", type=int)
@click.option("--name", required=True)
def keys_create(context: Context, project_id: int, name: str):
    issued = context.api().post(f"projects/{project_id}/api-keys/", {"name": name})
    if context.as_json:
        return _print_json(issued)
    out.print(f"Key {issued['name']} ({issued['prefix']}...): {issued['key']}\nStore it now: it is not shown again.")


@command(group=keys, name="revoke", help="Stop a serving API key at once.")
@click.argument("key_id", type=int)
def keys_revoke(context: Context, key_id: int):
    revoked = context.api().post(f"api-keys/{key_id}/revoke/")
    if context.as_json:
        return _print_json(revoked)
    out.print(f"Key {revoked['name']} ({revoked['prefix']}...) revoked.")


@keys.group(name="ssh", help="Your SSH public keys: every container workspace you order starts with all of them.")
def ssh_keys():
    pass


@command(group=ssh_keys, name="ls", help="Your SSH public keys with their fingerprints.")
def ssh_keys_list(context: Context):
    rows = context.api().get("ssh-keys/")
    if context.as_json:
        return _print_json(rows)
    table = Table("id", "name", "type", "fingerprint", "added")
    for row in rows:
        table.add_row(str(row["id"]), row["name"], row["key_type"], row["fingerprint"], row["created_at"][:10])
    out.print(table)


@command(group=ssh_keys, name="add", help="Add a public key (the .pub file's line), e.g. ~/.ssh/id_ed25519.pub.")
@click.argument("name")
@click.argument("public_key_file", type=click.File("r"))
def ssh_keys_add(context: Context, name: str, public_key_file):
    added = context.api().post("ssh-keys/", {"name": name, "public_key": public_key_file.read()})
    if context.as_json:
        return _print_json(added)
    out.print(f"Key {added['name']} added ({added['fingerprint']}).")


@command(group=ssh_keys, name="rm", help="Remove one of your SSH keys: workspaces started afterwards do not accept it.")
@click.argument("key_id", type=int)
def ssh_keys_remove(context: Context, key_id: int):
    context.api().delete(f"ssh-keys/{key_id}/")
    if context.as_json:
        return _print_json({"id": key_id, "removed": True})
    out.print(f"Key {key_id} removed.")


def main():
    cli(prog_name="cc")
