"""A real Slurm cluster on this machine, for the tests: Debian's munged, slurmctld, three `slurmd -N` nodes with GPU
GRES backed by fake character devices, and slurmrestd with JWT authentication.

Everything the cluster writes (configuration, keys, state, spool, logs, fake devices) lives under one fresh
directory in /tmp, every port is picked free at start, and the cluster name is unique: two engineers (or two test
runs) can each run a cluster on the same machine. Teardown stops the daemons this module started, by PID.

Facts this module is built on (measured on Debian 12, Slurm 22.05):
- munged and slurmrestd refuse to run as root: munged runs as `munge`, slurmrestd as a dedicated user (REST_USER).
- GRES without `File=` leaves the node INVAL, so every GPU is a fake char device (`mknod ... c 1 3`, /dev/null's).
- slurmd checks the declared CPUs/memory against the machine; `SlurmdParameters=config_overrides` makes it report
  the declared ones, so the test nodes can be larger than this 2-core machine (the jobs are `sleep`s).
- slurmrestd v0.0.38 has no node update: drain/resume goes through `scontrol update`, with this cluster's SLURM_CONF.
- Accounting (`accounting=True`): slurmdbd runs as slurm.conf's SlurmUser, as slurmctld does (root here): Slurm's
  clients restrict their munge credentials to that user, so a slurmdbd running as another user (Debian's `slurm`)
  refuses every client ("Unauthorized credential"). It keeps its books in a MariaDB database of this cluster's own
  name, created by slurmdbd at start and dropped at teardown; slurmctld registers the cluster itself when it starts.
"""

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REST_API = "/slurm/v0.0.38"
REST_USER = "slurmrest"  # runs slurmrestd and owns the JWT the tests use; jobs submitted over REST run as this user
MUNGE_USER = "munge"
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmrestd")
CLIENTS = ("scontrol", "sinfo", "squeue", "scancel", "sbatch", "sacct", "sacctmgr")
APT_PACKAGES = "munge slurmctld slurmd slurmrestd slurmdbd slurm-client slurm-wlm-jwt-plugin"
SLURM_USER = "root"  # slurm.conf's SlurmUser: slurmctld and slurmdbd run as it
# Where slurmdbd keeps the books: a MariaDB server the test machine runs (root without a password on the loopback).
MARIADB = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
ACCOUNT = "platform"  # the one Slurm account the platform's jobs are charged to
START_SECONDS = 60
STOP_SECONDS = 10
TOKEN_LIFESPAN_SECONDS = 24 * 3600
DYNAMIC_NODES = 8


class SlurmClusterError(RuntimeError):
    """A part of the cluster is missing or did not come up; the message says which and shows its log."""


@dataclass(frozen=True)
class NodeShape:
    """What one test node declares to Slurm: big enough for two of the demo catalog's one-GPU specs (12 vCPU,
    96 GiB each); slurmd reports these numbers (config_overrides), nothing checks them against the machine."""

    cpus: int = 32
    real_memory_mib: int = 262144
    gpu_type: str = "a100"
    gpus: int = 2

    @property
    def gres(self) -> str:
        """gpu:<type>:<n>, or gpu:<n> when gpu_type is "" (untyped GPUs)."""
        return f"gpu:{self.gpu_type}:{self.gpus}" if self.gpu_type else f"gpu:{self.gpus}"


@dataclass
class SlurmCluster:
    """A running cluster: what a test needs to reach it, and helpers to steer it as an operator would."""

    root: Path
    name: str
    node_names: tuple[str, ...]
    node_shape: NodeShape
    rest_url: str  # http://127.0.0.1:<port>, without the API prefix
    user_name: str
    token: str = field(repr=False)
    slurm_conf: Path
    partition: str = "gpu"
    switches: dict[str, tuple[str, ...]] = field(default_factory=dict)  # leaf switch -> its nodes (topology.conf)
    accounting_database: str = ""  # slurmdbd's MariaDB database; empty: no accounting
    _processes: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _commands: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _users: dict[str, str] = field(default_factory=dict, repr=False)
    _extra_env: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's command-line clients need to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    @property
    def job_dir(self) -> Path:
        """A directory REST_USER can write: use it as a job's current_working_directory and output path."""
        return self.root / "jobs"

    @property
    def daemon_groups(self) -> dict[str, int]:
        """Each running daemon's process group (it was started in a session of its own), by name."""
        return {name: process.pid for name, process in self._processes.items() if process.poll() is None}

    @property
    def rest_headers(self) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": self.user_name, "X-SLURM-USER-TOKEN": self.token}

    def run(self, command: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run one of Slurm's clients (CLIENTS) against this cluster, as root (a job sbatch submits runs as root)."""
        if command not in CLIENTS:
            raise ValueError(f"{command!r} is not one of {CLIENTS}")
        return subprocess.run([command, *args], env=self.env, capture_output=True, text=True, timeout=30, check=check)

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args).stdout

    def scancel(self, *args: str) -> str:
        return self.run("scancel", *args).stdout

    def node_states(self) -> dict[str, str]:
        """Node name -> Slurm's long state name as sinfo shows it (e.g. idle, drained, mixed)."""
        output = self.run("sinfo", "--noheader", "--Node", "--format=%N %T").stdout
        return dict(line.split() for line in output.splitlines() if line.strip())

    def wait_for_node_state(self, node: str, state: str, seconds: float = 15) -> None:
        """Wait until sinfo shows the node in this state; right after a resume it shows "idle*" (not responding)
        until slurmctld's next ping of its slurmd comes back."""
        deadline = time.monotonic() + seconds
        while (current := self.node_states()[node]) != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"{node} is {current!r}, not {state!r}, after {seconds}s")
            time.sleep(0.2)

    def wait_until_nodes_respond(self, seconds: float = 30) -> None:
        """Wait until every node's slurmd has registered with slurmctld (sinfo marks one that has not with "*"),
        which takes a few seconds after slurmctld starts again; jobs pend ReqNodeNotAvail meanwhile."""
        deadline = time.monotonic() + seconds
        while not_responding := {node: state for node, state in self.node_states().items() if state.endswith("*")}:
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes not responding after {seconds}s: {not_responding}")
            time.sleep(0.2)

    def node_reason(self, node: str) -> str:
        output = self.run("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%E").stdout
        return output.strip()

    def resume_all(self) -> None:
        """Return every node to service, so one test's drain never leaks into the next (the cluster is shared)."""
        self.run("scontrol", "update", f"nodename={','.join(self.node_names)}", "state=resume", check=False)

    def cancel_all_jobs(self) -> None:
        self.run("scancel", "--full", f"--partition={self.partition}", check=False)

    def reservations(self) -> dict[str, str]:
        """Reservation name -> scontrol's one-line description of it."""
        lines = self.run("scontrol", "--oneliner", "show", "reservation", check=False).stdout.splitlines()
        return {line.split()[0].removeprefix("ReservationName="): line for line in lines if "ReservationName=" in line}

    def delete_all_reservations(self) -> None:
        for name in self.reservations():
            self.run("scontrol", "delete", f"reservationname={name}", check=False)

    def reset(self) -> None:
        """Restart what a test stopped, cancel every job, delete every reservation and resume every node: the
        cluster is shared by the session, a test's leftovers are not."""
        for name in [name for name in self._commands if name not in self._processes]:
            self.start_daemon(name)
        self.cancel_all_jobs()
        self.delete_all_reservations()
        self.resume_all()
        for node in self.node_names:
            self.wait_for_node_state(node, "idle", seconds=30)

    def pid(self, name: str) -> int:
        """The PID of a running daemon this cluster started (the leader of its own process group)."""
        return self._processes[name].pid

    def stop_daemon(self, name: str) -> None:
        """Stop one daemon this cluster started (e.g. "slurmctld", "slurmd-<node>"), as an outage would: SIGTERM to
        its PID's process group, SIGKILL if it lingers."""
        _terminate(self._processes.pop(name))

    def start_daemon(self, name: str) -> None:
        """Start a stopped daemon again with its state kept (slurmctld without -c), and wait until it answers."""
        command = [arg for arg in self._commands[name] if arg != "-c"]
        _start(self, name, command, user=self._users.get(name), extra_env=self._extra_env.get(name))
        if name == "slurmctld":
            _wait_for(self._controller_answers, self, name)
        if name == "slurmrestd":
            _wait_for(lambda: _rest_answers(self), self, name)
        if name == "slurmdbd":
            _wait_for(lambda: _sacctmgr_answers(self), self, name)

    def stop_controller(self) -> None:
        """slurmctld stopped (by PID): slurmrestd then answers every call after about 9 s with HTTP 500, errno -1."""
        self.stop_daemon("slurmctld")

    def start_controller(self) -> None:
        """slurmctld started again with its state; returns once `scontrol ping` says UP (its nodes register a
        moment later: submissions meanwhile are accepted with error 2068)."""
        self.start_daemon("slurmctld")

    def stop_rest(self) -> None:
        """slurmrestd stopped (by PID): connections to the REST API are refused."""
        self.stop_daemon("slurmrestd")

    def start_rest(self) -> None:
        """slurmrestd started again; returns once it answers a ping."""
        self.start_daemon("slurmrestd")

    def _controller_answers(self) -> bool:
        return "UP" in self.run("scontrol", "ping", check=False).stdout

    def log(self, daemon: str) -> str:
        path = self.root / "log" / f"{daemon}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else f"(no {path})"


def missing_parts(accounting: bool = False) -> list[str]:
    """The programs and users the cluster needs that this machine lacks (`make slurm` installs the programs)."""
    programs = DAEMONS + CLIENTS + (("slurmdbd",) if accounting else ())
    missing = [f"program {name}" for name in programs if shutil.which(name) is None]
    try:
        pwd.getpwnam(MUNGE_USER)
    except KeyError:
        missing.append(f"user {MUNGE_USER}")
    return missing


@contextlib.contextmanager
def running_cluster(
    node_count: int = 3,
    node_shape: NodeShape = NodeShape(),
    name_prefix: str = "cc",
    leaf_switches: int = 0,
    accounting: bool = False,
) -> Iterator[SlurmCluster]:
    """Start a cluster, wait until every node is IDLE and slurmrestd answers, yield it, stop it. With
    `leaf_switches`, the nodes are split in that many leaf switches of equal size under one spine in a topology.conf
    (TopologyPlugin=topology/tree; `SlurmCluster.switches` names them). With `accounting`, slurmdbd keeps the jobs'
    books (sacct reads them) in a MariaDB database of the cluster's own (MARIADB), dropped at the end."""
    missing = missing_parts(accounting)
    if missing:
        raise SlurmClusterError(f"Missing for the Slurm test cluster: {', '.join(missing)} (run `make slurm`).")
    _ensure_rest_user()
    root = Path(tempfile.mkdtemp(prefix=f"{name_prefix}-slurm-", dir="/tmp"))
    # The munge and REST users must reach the configuration and sockets inside it.
    root.chmod(0o755)
    cluster_name = f"{name_prefix}{secrets.token_hex(4)}"
    node_names = tuple(f"{cluster_name}-n{index}" for index in range(1, node_count + 1))
    ports = free_ports(node_count + 2)
    cluster = SlurmCluster(
        root=root,
        name=cluster_name,
        node_names=node_names,
        node_shape=node_shape,
        rest_url=f"http://127.0.0.1:{ports[-1]}",
        user_name=REST_USER,
        token="",
        slurm_conf=root / "slurm.conf",
        # One database per cluster: two test runs (or pytest workers) never share their books.
        accounting_database=f"slurm_acct_{cluster_name}" if accounting else "",
    )
    dbd_port = free_ports(1)[0] if accounting else 0
    try:
        cluster.switches = _switches(node_names, leaf_switches)
        _write_files(cluster, controller_port=ports[0], node_ports=ports[1:-1], dbd_port=dbd_port)
        _start(cluster, "munged", _munged_command(root), user=MUNGE_USER)
        _wait_for(lambda: (root / "munge" / "munge.socket").exists(), cluster, "munged")
        if accounting:
            _start_accounting(cluster)
        _start(cluster, "slurmctld", ["slurmctld", "-D", "-c", "-f", str(cluster.slurm_conf)])
        _wait_for(cluster._controller_answers, cluster, "slurmctld")
        for node in node_names:
            _start(cluster, f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(cluster.slurm_conf)])
        _wait_for(lambda: set(cluster.node_states().values()) == {"idle"}, cluster, "slurmd")
        if accounting:
            _register_accounts(cluster)
        cluster.token = _issue_token(cluster)
        _start(
            cluster,
            "slurmrestd",
            ["slurmrestd", "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38", cluster.rest_url.removeprefix("http://")],
            user=REST_USER,
            extra_env={"SLURM_JWT": "daemon"},
        )
        _wait_for(lambda: _rest_answers(cluster), cluster, "slurmrestd")
        yield cluster
    finally:
        _stop(cluster)
        if cluster.accounting_database:
            _drop_database(cluster.accounting_database)
        shutil.rmtree(root, ignore_errors=True)


# --- Files ---------------------------------------------------------------------------------------------------------


def _write_files(cluster: SlurmCluster, *, controller_port: int, node_ports: list[int], dbd_port: int) -> None:
    root = cluster.root
    for directory in ("state", "spool", "log", "run", "dev"):
        (root / directory).mkdir()
    _make_owned_dir(root / "munge", MUNGE_USER, 0o755)
    _write_owned(root / "munge" / "munge.key", secrets.token_bytes(1024), MUNGE_USER, 0o400)
    _make_owned_dir(cluster.job_dir, REST_USER, 0o700)  # private to the job user, as SLURM_JOB_DIRECTORY must be
    # slurmctld (root) signs and checks the tokens with this key; nobody else reads it.
    _write_owned(root / "jwt.key", secrets.token_bytes(32), "root", 0o600)
    gres_lines = ["AutoDetect=off"]
    node_lines = []
    for node, port in zip(cluster.node_names, node_ports, strict=True):
        gres_lines.append(_fake_gpus(cluster, node))
        shape = cluster.node_shape
        node_lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={shape.cpus} "
            f"RealMemory={shape.real_memory_mib} Gres={shape.gres} State=UNKNOWN"
        )
    (root / "gres.conf").write_text("\n".join(gres_lines) + "\n")
    (root / "slurm.conf").write_text(_slurm_conf(cluster, controller_port, node_lines, dbd_port))
    if dbd_port:
        # slurmdbd refuses a configuration its SlurmUser does not own or others may read (it holds the password).
        _write_owned(root / "slurmdbd.conf", _slurmdbd_conf(cluster, dbd_port).encode(), SLURM_USER, 0o600)
    if cluster.switches:
        (root / "topology.conf").write_text(_topology_conf(cluster.switches))


def _switches(node_names: tuple[str, ...], leaves: int) -> dict[str, tuple[str, ...]]:
    """The nodes in `leaves` leaf switches of equal size (s1, s2, ...), in order; none without leaves."""
    size = -(-len(node_names) // leaves) if leaves else 0
    return {f"s{number + 1}": node_names[number * size : (number + 1) * size] for number in range(leaves)}


def _topology_conf(switches: dict[str, tuple[str, ...]]) -> str:
    """A two-level tree: the leaf switches with their nodes, and one spine over them."""
    lines = [f"SwitchName={switch} Nodes={','.join(nodes)}" for switch, nodes in switches.items()]
    lines.append(f"SwitchName=spine Switches={','.join(switches)}")
    return "\n".join(lines) + "\n"


def _fake_gpus(cluster: SlurmCluster, node: str) -> str:
    """One fake char device per GPU (/dev/null's numbers), and the gres.conf line that binds them to the node."""
    directory = cluster.root / "dev" / node
    directory.mkdir()
    for index in range(cluster.node_shape.gpus):
        os.mknod(directory / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    last = cluster.node_shape.gpus - 1
    gpu_type = f" Type={cluster.node_shape.gpu_type}" if cluster.node_shape.gpu_type else ""
    return f"NodeName={node} Name=gpu{gpu_type} File={directory}/nvidia[0-{last}]"


def _slurm_conf(cluster: SlurmCluster, controller_port: int, node_lines: list[str], dbd_port: int) -> str:
    root = cluster.root
    settings = {
        "ClusterName": cluster.name,
        "SlurmctldHost": f"{socket.gethostname()}(127.0.0.1)",
        "SlurmctldPort": controller_port,
        "SlurmUser": SLURM_USER,
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={root / 'munge' / 'munge.socket'}",
        "AuthAltTypes": "auth/jwt",
        "AuthAltParameters": f"jwt_key={root / 'jwt.key'}",
        "StateSaveLocation": root / "state",
        "SlurmdSpoolDir": root / "spool" / "%n",
        "SlurmctldPidFile": root / "run" / "slurmctld.pid",
        "SlurmdPidFile": root / "run" / "slurmd-%n.pid",
        "SlurmctldLogFile": root / "log" / "slurmctld.log",
        "SlurmdLogFile": root / "log" / "slurmd-%n.log",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        "SlurmdParameters": "config_overrides",
        "GresTypes": "gpu",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory",
        "DefMemPerCPU": 256,
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/none",
        "MpiDefault": "none",
        "MailProg": "/bin/true",
        # A node that went DOWN comes back as soon as its slurmd registers again.
        "ReturnToService": 2,
        "SlurmdTimeout": 30,
        "KillWait": 2,
        # Finished jobs stay visible long enough for a reconciler to see how they ended.
        "MinJobAge": 600,
        # Room for dynamic nodes (`slurmd -Z`: bare-metal servers joining, tests/provisioning/test_ansible_*); a
        # tree width above the node count, as dynamic nodes need (slurmd cannot forward to nodes it does not know).
        "MaxNodeCount": len(node_lines) + DYNAMIC_NODES,
        "TreeWidth": 65533,
    }
    if cluster.switches:
        settings["TopologyPlugin"] = "topology/tree"  # topology.conf beside slurm.conf
    if dbd_port:
        # Every job's allocated GPUs are in its books (AllocTRES gres/gpu=N), beside CPUs, memory and nodes.
        settings |= {
            "AccountingStorageType": "accounting_storage/slurmdbd",
            "AccountingStorageHost": "127.0.0.1",
            "AccountingStoragePort": dbd_port,
            "AccountingStorageTRES": "gres/gpu",
            # With munge, the "password" names the munge socket the connections to slurmdbd use (AuthInfo does not
            # reach them): this cluster's munged, not the machine's default socket.
            "AccountingStoragePass": root / "munge" / "munge.socket",
        }
    lines = [f"{key}={value}" for key, value in settings.items()]
    lines += node_lines
    lines.append(f"PartitionName={cluster.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _slurmdbd_conf(cluster: SlurmCluster, dbd_port: int) -> str:
    root = cluster.root
    settings = {
        "AuthType": "auth/munge",
        "AuthInfo": f"socket={root / 'munge' / 'munge.socket'}",
        "DbdHost": "localhost",
        "DbdAddr": "127.0.0.1",
        "DbdPort": dbd_port,
        "SlurmUser": SLURM_USER,
        "PidFile": root / "run" / "slurmdbd.pid",
        "LogFile": root / "log" / "slurmdbd.log",
        "DebugLevel": "info",
        "StorageType": "accounting_storage/mysql",
        "StorageHost": MARIADB["host"],
        "StoragePort": MARIADB["port"],
        "StorageUser": MARIADB["user"],
        "StorageLoc": cluster.accounting_database,
    }
    lines = [f"{key}={value}" for key, value in settings.items()]
    if MARIADB["password"]:
        lines.append(f"StoragePass={MARIADB['password']}")
    return "\n".join(lines) + "\n"


def _make_owned_dir(path: Path, user: str, mode: int) -> None:
    path.mkdir()
    account = pwd.getpwnam(user)
    os.chown(path, account.pw_uid, account.pw_gid)
    path.chmod(mode)


def _write_owned(path: Path, content: bytes, user: str, mode: int) -> None:
    path.write_bytes(content)
    account = pwd.getpwnam(user)
    os.chown(path, account.pw_uid, account.pw_gid)
    path.chmod(mode)


def _ensure_rest_user() -> None:
    """slurmrestd refuses root, so it runs as a system user of its own; create it once per machine."""
    try:
        pwd.getpwnam(REST_USER)
    except KeyError:
        result = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", REST_USER],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise SlurmClusterError(f"Could not create user {REST_USER}: {result.stderr.strip()}") from None


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now; all held open together so that none is handed out twice."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


# --- Processes -----------------------------------------------------------------------------------------------------


def _munged_command(root: Path) -> list[str]:
    munge = root / "munge"
    return [
        "munged",
        "--foreground",
        f"--key-file={munge / 'munge.key'}",
        f"--socket={munge / 'munge.socket'}",
        f"--pid-file={munge / 'munged.pid'}",
        f"--log-file={munge / 'munged.log'}",
        f"--seed-file={munge / 'munged.seed'}",
    ]


def _start(
    cluster: SlurmCluster,
    name: str,
    command: list[str],
    *,
    user: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> None:
    log = open(cluster.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (the daemon owns it for its lifetime)
    account = pwd.getpwnam(user) if user else None
    process = subprocess.Popen(
        command,
        env={**cluster.env, **(extra_env or {})},
        cwd=cluster.root,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        user=account.pw_uid if account else None,
        group=account.pw_gid if account else None,
        # Drop root's supplementary groups along with its uid.
        extra_groups=[] if account else None,
        # Its own process group, so that teardown can stop the daemon and what it forked, and nothing else.
        start_new_session=True,
    )
    log.close()
    cluster._processes[name] = process
    cluster._commands[name] = command
    if user:
        cluster._users[name] = user
    if extra_env:
        cluster._extra_env[name] = extra_env


def _start_accounting(cluster: SlurmCluster) -> None:
    """slurmdbd (root, as slurmctld), before slurmctld, which registers the cluster with it when it starts; it creates
    its database and tables on the first start."""
    _start(cluster, "slurmdbd", ["slurmdbd", "-D"])
    _wait_for(lambda: _sacctmgr_answers(cluster), cluster, "slurmdbd")


def _sacctmgr_answers(cluster: SlurmCluster) -> bool:
    return cluster.run("sacctmgr", "--noheader", "show", "cluster", check=False).returncode == 0


def _register_accounts(cluster: SlurmCluster) -> None:
    """The account the platform's jobs are charged to, with the users that submit them (the REST user, and root for
    scontrol and the tests), so that the books name who ran what. slurmctld added the cluster itself."""
    cluster.run("sacctmgr", "--immediate", "add", "account", ACCOUNT, f"cluster={cluster.name}")
    cluster.run(
        "sacctmgr", "--immediate", "add", "user", f"{REST_USER},root", f"account={ACCOUNT}", f"cluster={cluster.name}"
    )


def _drop_database(name: str) -> None:
    """Drop the cluster's books (mysql client, as slurmdbd reached the server); a server gone by now is left alone."""
    server = [f"--host={MARIADB['host']}", f"--port={MARIADB['port']}", f"--user={MARIADB['user']}"]
    password = {"MYSQL_PWD": MARIADB["password"]} if MARIADB["password"] else {}
    subprocess.run(
        ["mysql", *server, "--execute", f"DROP DATABASE IF EXISTS `{name}`"],
        env={**os.environ, **password},
        capture_output=True,
        timeout=30,
        check=False,
    )


def _wait_for(condition, cluster: SlurmCluster, part: str) -> None:
    deadline = time.monotonic() + START_SECONDS
    last_error = ""
    while time.monotonic() < deadline:
        for name, process in cluster._processes.items():
            if process.poll() is not None:
                raise SlurmClusterError(f"{name} exited with {process.returncode}:\n{_output(cluster, name)}")
        try:
            if condition():
                return
        except (subprocess.SubprocessError, httpx.HTTPError, ValueError) as error:
            last_error = str(error)
        time.sleep(0.3)
    raise SlurmClusterError(
        f"{part} did not come up within {START_SECONDS}s ({last_error}):\n"
        + "\n".join(f"--- {name}\n{_output(cluster, name)}" for name in cluster._processes)
        + f"\n--- slurmctld.log\n{cluster.log('slurmctld')}"
    )


def _output(cluster: SlurmCluster, name: str) -> str:
    path = cluster.root / "log" / f"{name}.out"
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _issue_token(cluster: SlurmCluster) -> str:
    output = cluster.scontrol("token", f"username={cluster.user_name}", f"lifespan={TOKEN_LIFESPAN_SECONDS}")
    return output.strip().removeprefix("SLURM_JWT=")


def _rest_answers(cluster: SlurmCluster) -> bool:
    response = httpx.get(f"{cluster.rest_url}{REST_API}/ping", headers=cluster.rest_headers, timeout=5)
    return response.status_code == 200


def _stop(cluster: SlurmCluster) -> None:
    """Cancel what still runs, then stop the daemons in reverse start order: SIGTERM, then SIGKILL if they linger."""
    if "slurmctld" in cluster._processes and cluster._processes["slurmctld"].poll() is None:
        cluster.cancel_all_jobs()
    for process in reversed(cluster._processes.values()):
        _terminate(process)
    _kill_job_processes(cluster)


def _terminate(process: subprocess.Popen) -> None:
    """SIGTERM to the daemon's own process group, SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_SECONDS)


def _kill_job_processes(cluster: SlurmCluster) -> None:
    """Kill what the nodes forked and left behind (slurmstepd and job scripts live in sessions of their own, and
    outlive slurmd when a test stopped slurmctld before its jobs were cancelled). They are recognised by this
    cluster's SLURM_CONF in their environment, which only processes of this cluster carry."""
    marker = f"SLURM_CONF={cluster.slurm_conf}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue


def main() -> None:
    """`python -m devcluster.slurm_cluster [--env-file PATH]`: run a cluster until interrupted (for a demo against it).
    Writes the settings that point the product at it (SLURM_REST_URL, SLURM_USER_NAME, SLURM_JWT_FILE, SLURM_CONF)
    as shell `export` lines to the env file, and the JWT to a file beside the cluster's configuration."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--env-file", type=Path, default=Path("slurm.env"))
    arguments = parser.parse_args()
    with running_cluster(name_prefix="demo", accounting=True) as cluster:
        token_file = cluster.root / "rest.jwt"
        token_file.write_text(cluster.token)
        token_file.chmod(0o600)
        settings = {
            "SLURM_REST_URL": cluster.rest_url,
            "SLURM_USER_NAME": cluster.user_name,
            "SLURM_JWT_FILE": token_file,
            "SLURM_CONF": cluster.slurm_conf,
        }
        arguments.env_file.write_text("".join(f"export {key}={value}\n" for key, value in settings.items()))
        nodes = ", ".join(cluster.node_names)
        print(f"Slurm cluster {cluster.name} up (nodes {nodes}); settings in {arguments.env_file}", flush=True)
        # Blocked only now, after the daemons started (they inherit the mask); teardown follows either signal.
        stop_signals = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        signal.sigwait(stop_signals)


if __name__ == "__main__":
    main()
