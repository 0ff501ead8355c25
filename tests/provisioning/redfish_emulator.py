"""Fixtures around the BMC driver tests: the real sushy-tools Redfish emulator, the image server it downloads
virtual media from, sushy-tools' static mockup server serving HGX-like GPU servers (tests/provisioning/
redfish_mockup.py), and a fault-injecting stand-in for what neither can be made to do (errors, slowness).

Both run from their own virtualenv (`make redfish-emulator`), because they import the PyPI `requests` library that
our `requests` app shadows (DESIGN.md).
"""

import contextlib
import functools
import http.server
import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.provisioning.redfish_mockup import write_hgx_mockup

REPO = Path(__file__).resolve().parents[2]
EMULATOR_START_SECONDS = 30
# One fake system per test concern, so tests that change power, boot or media state never see each other's.
FAKE_SYSTEMS = {
    "inventory": "5c0c0d6e-0000-4000-8000-000000000001",
    "boot": "5c0c0d6e-0000-4000-8000-000000000002",
    "media": "5c0c0d6e-0000-4000-8000-000000000003",
    "power": "5c0c0d6e-0000-4000-8000-000000000004",
    "pipeline": "5c0c0d6e-0000-4000-8000-000000000005",  # the bare-metal pipeline end to end
    "hgx": "5c0c0d6e-0000-4000-8000-000000000006",  # power, boot and media of the mockup GPU server
    "pxe": "5c0c0d6e-0000-4000-8000-000000000007",  # a bare-metal order booting from the network
}
AUTH_SYSTEM = {"only": "5c0c0d6e-0000-4000-8000-0000000000a1"}
AUTH_USER, AUTH_PASSWORD = "bmc-admin", "s3cret-Emulator-Pa55"
ISO_FILES = ("installer-a.iso", "installer-b.iso")


@dataclass(frozen=True)
class Emulator:
    url: str  # http://127.0.0.1:<port>, the BMC base URL
    system_ids: dict[str, str]

    def system_url(self, name: str) -> str:
        return f"{self.url}/redfish/v1/Systems/{self.system_ids[name]}"


@pytest.fixture(scope="session")
def sushy_emulator(tmp_path_factory) -> Emulator:
    """The emulator with several fake systems, all powered off, without authentication."""
    with _running_emulator(tmp_path_factory.mktemp("sushy"), FAKE_SYSTEMS) as emulator:
        yield emulator


@pytest.fixture(scope="session")
def sushy_emulator_with_auth(tmp_path_factory) -> Emulator:
    """The emulator serving one system behind HTTP basic auth (AUTH_USER / AUTH_PASSWORD)."""
    workdir = tmp_path_factory.mktemp("sushy-auth")
    auth_file = workdir / "htpasswd"
    auth_file.write_text(f"{AUTH_USER}:{_bcrypt_hash(AUTH_PASSWORD)}\n")
    with _running_emulator(workdir, AUTH_SYSTEM, SUSHY_EMULATOR_AUTH_FILE=str(auth_file)) as emulator:
        yield emulator


@pytest.fixture(scope="session")
def sushy_static(tmp_path_factory) -> Emulator:
    """`sushy-static` serving the HGX mockup: one read-only system per variant (hgx, hgx-critical-gpu,
    hgx-seven-gpus), the inventory half of a GPU server's BMC."""
    workdir = tmp_path_factory.mktemp("sushy-static")
    systems = write_hgx_mockup(workdir / "mockup")
    port = free_loopback_port()
    command = [str(_redfish_binary("sushy-static")), "-i", "127.0.0.1", "-p", str(port), "-m", str(workdir / "mockup")]
    with _running(
        command, Emulator(url=f"http://127.0.0.1:{port}", system_ids=systems), workdir / "static.log"
    ) as static:
        yield static


@pytest.fixture(scope="session")
def image_server(tmp_path_factory) -> str:
    """Base URL of a loopback HTTP server with tiny fake ISO files: the emulator downloads what it inserts."""
    directory = tmp_path_factory.mktemp("images")
    for name in ISO_FILES:
        (directory / name).write_bytes(b"CD001 fake installer image " + name.encode())
    handler = functools.partial(_QuietFileHandler, directory=str(directory))
    with _serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)) as server:
        yield f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def redfish_stand_in():
    """A fault-injecting, hand-written stand-in for a BMC (see RedfishStandIn)."""
    with _stand_in_serving() as stand_in:
        yield stand_in


@pytest.fixture
def elsewhere():
    """A second stand-in on another origin (another port): what a BMC's link may point to. It records every call
    that reaches it, with its headers (Authorization, for one)."""
    with _stand_in_serving() as stand_in:
        yield stand_in


@contextlib.contextmanager
def _stand_in_serving():
    stand_in = RedfishStandIn()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandInHandler)
    server.stand_in = stand_in
    with _serving(server):
        stand_in.url = f"http://127.0.0.1:{server.server_port}"
        try:
            yield stand_in
        finally:
            stand_in.released.set()  # held answers go out now, so the server can shut down


@dataclass
class RedfishStandIn:
    """Not Redfish: answers each scripted path with a canned JSON body, status and delay, 404 otherwise, and
    records every request. For faults the real emulator cannot produce, and resource shapes it does not serve."""

    url: str = ""
    routes: dict[str, tuple[int, dict, bool, dict]] = field(default_factory=dict)
    received: list[dict] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)

    def answer(
        self, path: str, body: dict, *, status: int = 200, held: bool = False, headers: dict | None = None
    ) -> None:
        """A held answer goes out only when the test ends: slower than any client timeout, with no clock involved."""
        self.routes[path] = (status, body, held, headers or {})


class _StandInHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        stand_in = self.server.stand_in
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        stand_in.received.append({"method": self.command, "path": self.path, "body": body, "headers": self.headers})
        status, answer, held, headers = stand_in.routes.get(
            self.path, (404, {"error": {"message": "No such resource"}}, False, {})
        )
        if held:
            stand_in.released.wait()
        payload = json.dumps(answer).encode()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up waiting, as intended
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    do_POST = do_PATCH = do_GET

    def log_message(self, format, *args):
        pass


class _QuietFileHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@contextlib.contextmanager
def _serving(server: http.server.HTTPServer):
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _running_emulator(workdir: Path, systems: dict[str, str], **extra_config):
    port = free_loopback_port()
    config = workdir / "emulator.conf"
    config.write_text(_emulator_config(workdir, systems, extra_config))
    command = [str(_emulator_binary()), "--config", str(config), "-i", "127.0.0.1", "-p", str(port)]
    with _running(
        command, Emulator(url=f"http://127.0.0.1:{port}", system_ids=systems), workdir / "emulator.log"
    ) as em:
        yield em


@contextlib.contextmanager
def _running(command: list[str], emulator: Emulator, log: Path):
    """Start a Redfish server process, wait until its service root answers, and stop it (by its own PID) after."""
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_until_serving(emulator, process, log, Path(command[0]).name)
        yield emulator
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _emulator_binary() -> Path:
    return _redfish_binary("sushy-emulator")


def _redfish_binary(name: str) -> Path:
    """A sushy-tools program: SUSHY_EMULATOR names sushy-emulator, and sushy-static is its neighbour."""
    emulator = Path(os.environ.get("SUSHY_EMULATOR") or REPO / ".venv-redfish" / "bin" / "sushy-emulator")
    binary = emulator.with_name(name)
    if not binary.exists():
        pytest.fail(
            f"The sushy-tools program {name} is missing at {binary}: run `make redfish-emulator` "
            "(or point SUSHY_EMULATOR at a sushy-emulator binary).",
            pytrace=False,
        )
    return binary


def _emulator_config(workdir: Path, systems: dict[str, str], extra_config: dict) -> str:
    fake_systems = [
        {
            "uuid": uuid,
            "name": f"fake-{name}",
            "power_state": "Off",
            "nics": [{"mac": f"52:54:00:00:00:{index:02x}", "ip": f"192.0.2.{index + 10}"}],
        }
        for index, (name, uuid) in enumerate(systems.items())
    ]
    settings = {
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_FAKE_SYSTEMS": fake_systems,
        # The fake driver keeps its state in SQLite files, by default shared by every emulator on the machine.
        "SUSHY_EMULATOR_STATE_DIR": str(workdir / "state"),
        **extra_config,
    }
    return "".join(f"{key} = {value!r}\n" for key, value in settings.items())


def _bcrypt_hash(password: str) -> str:
    """The emulator accepts only bcrypt htpasswd entries; its own interpreter has bcrypt (a sushy-tools dependency)."""
    interpreter = _emulator_binary().read_text().splitlines()[0].removeprefix("#!").split()
    # Few rounds: the emulator checks the hash on every request.
    script = "import bcrypt, sys; print(bcrypt.hashpw(sys.stdin.read().encode(), bcrypt.gensalt(rounds=4)).decode())"
    result = subprocess.run([*interpreter, "-c", script], input=password, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def _wait_until_serving(emulator: Emulator, process: subprocess.Popen, log: Path, name: str) -> None:
    deadline = time.monotonic() + EMULATOR_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}", pytrace=False)
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{emulator.url}/redfish/v1/", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"{name} did not answer within {EMULATOR_START_SECONDS}s:\n{log.read_text()[-3000:]}")


def free_loopback_port() -> int:
    """A port nothing listens on right now (also what an unreachable BMC looks like)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
