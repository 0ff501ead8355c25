"""A real OpenLDAP directory (Debian's slapd) on the loopback for the LDAP sign-in and sync tests, and `make run-sso`:
people and groups (one group inside another, as AD's nested groups), started by PID from a throwaway configuration
and stopped by the same PID. `reset()` puts the people and groups back as they started.

Run alone (`python -m devcluster.ldap_directory --port 3389`) it serves the demo's directory until interrupted.
"""

import argparse
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import ldap
import ldap.modlist

SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"
SCHEMAS = ["core", "cosine", "inetorgperson", "nis"]
BASE = "dc=example,dc=org"
ADMIN_DN, ADMIN_PASSWORD = f"cn=admin,{BASE}", "directory-admin-secret"
PEOPLE, GROUPS = f"ou=people,{BASE}", f"ou=groups,{BASE}"
PASSWORD = "directory-password-1"

# uid -> (given name, surname)
PEOPLE_ENTRIES = {
    "alice": ("Alice", "Archer"),
    "bob": ("Bob", "Builder"),
    "carol": ("Carol", "Chen"),
    "dave": ("Dave", "Dalton"),
}
# group -> members (people by uid, groups as "group:<cn>"): ml-engineers sits inside research, as nested AD groups do.
GROUP_ENTRIES = {
    "ml-engineers": ["alice"],
    "research": ["group:ml-engineers", "bob"],
    "research-approvers": ["carol"],
    "platform-ops": ["dave"],
}


def person_dn(uid: str) -> str:
    return f"uid={uid},{PEOPLE}"


def group_dn(cn: str) -> str:
    return f"cn={cn},{GROUPS}"


def _member_dn(member: str) -> str:
    return group_dn(member.removeprefix("group:")) if member.startswith("group:") else person_dn(member)


@dataclass
class Directory:
    uri: str
    process: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.process.pid

    def settings(self) -> dict:
        """Environment variables that point the platform at this directory (config/settings.py, LDAP_*)."""
        return {
            "LDAP_SERVER_URI": self.uri,
            "LDAP_BIND_DN": ADMIN_DN,
            "LDAP_BIND_PASSWORD": ADMIN_PASSWORD,
            "LDAP_USER_SEARCH_BASE": PEOPLE,
            "LDAP_USER_FILTER": "(uid=%(user)s)",
            "LDAP_GROUP_SEARCH_BASE": GROUPS,
            "LDAP_GROUP_FILTER": "(objectClass=groupOfNames)",
            "LDAP_GROUP_TYPE": "nested_group_of_names",
        }

    def _admin(self):
        connection = ldap.initialize(self.uri)
        connection.simple_bind_s(ADMIN_DN, ADMIN_PASSWORD)
        return connection

    def set_members(self, group: str, members: list[str]) -> None:
        connection = self._admin()
        try:
            values = [_member_dn(member).encode() for member in members] or [ADMIN_DN.encode()]
            connection.modify_s(group_dn(group), [(ldap.MOD_REPLACE, "member", values)])
        finally:
            connection.unbind_s()

    def remove_person(self, uid: str) -> None:
        connection = self._admin()
        try:
            connection.delete_s(person_dn(uid))
        finally:
            connection.unbind_s()

    def reset(self) -> None:
        """Every person (with PASSWORD) and group as at the start."""
        connection = self._admin()
        try:
            for uid, (given, surname) in PEOPLE_ENTRIES.items():
                _replace(connection, person_dn(uid), _person(uid, given, surname))
            for cn, members in GROUP_ENTRIES.items():
                _replace(connection, group_dn(cn), _group(cn, members))
        finally:
            connection.unbind_s()


def _person(uid: str, given: str, surname: str) -> dict:
    return {
        "objectClass": [b"inetOrgPerson"],
        "uid": [uid.encode()],
        "cn": [f"{given} {surname}".encode()],
        "givenName": [given.encode()],
        "sn": [surname.encode()],
        "mail": [f"{uid}@example.org".encode()],
        "userPassword": [PASSWORD.encode()],
    }


def _group(cn: str, members: list[str]) -> dict:
    # groupOfNames needs a member: an empty group holds the admin entry, which is nobody.
    values = [_member_dn(member).encode() for member in members] or [ADMIN_DN.encode()]
    return {"objectClass": [b"groupOfNames"], "cn": [cn.encode()], "member": values}


def _replace(connection, dn: str, attributes: dict) -> None:
    with suppress(ldap.NO_SUCH_OBJECT):
        connection.delete_s(dn)
    connection.add_s(dn, ldap.modlist.addModlist(attributes))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _configuration(root: Path) -> Path:
    (root / "data").mkdir()
    includes = "\n".join(f"include /etc/ldap/schema/{schema}.schema" for schema in SCHEMAS)
    conf = root / "slapd.conf"
    conf.write_text(
        f"""{includes}
pidfile {root}/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 104857600
suffix "{BASE}"
rootdn "{ADMIN_DN}"
rootpw {ADMIN_PASSWORD}
directory {root}/data
access to attrs=userPassword by self write by anonymous auth by * none
access to * by * read
"""
    )
    return conf


def _wait_until_up(uri: str, process: subprocess.Popen, deadline: float) -> None:
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"slapd exited with {process.returncode}: {process.stderr.read().decode()[-2000:]}")
        try:
            connection = ldap.initialize(uri)
            connection.simple_bind_s(ADMIN_DN, ADMIN_PASSWORD)
            connection.unbind_s()
            return
        except ldap.SERVER_DOWN:
            if time.monotonic() > deadline:
                raise RuntimeError("slapd did not answer within 20 s") from None
            time.sleep(0.05)  # polling a starting daemon, with a deadline


def _seed(directory: Directory) -> None:
    connection = directory._admin()
    try:
        connection.add_s(
            BASE,
            ldap.modlist.addModlist(
                {"objectClass": [b"dcObject", b"organization"], "o": [b"Example"], "dc": [b"example"]}
            ),
        )
        for unit in ("people", "groups"):
            connection.add_s(
                f"ou={unit},{BASE}",
                ldap.modlist.addModlist({"objectClass": [b"organizationalUnit"], "ou": [unit.encode()]}),
            )
    finally:
        connection.unbind_s()
    directory.reset()


@contextmanager
def running_directory(port: int | None = None):
    """slapd with the test directory, stopped (by its PID) and its files removed on leaving."""
    if not Path(SLAPD).exists():
        raise RuntimeError("slapd is not installed: `make test` installs Debian's slapd and ldap-utils")
    root = Path(tempfile.mkdtemp(prefix="cc-slapd-"))
    uri = f"ldap://127.0.0.1:{port or _free_port()}"
    process = subprocess.Popen(
        [SLAPD, "-d", "0", "-f", str(_configuration(root)), "-h", f"{uri}/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    directory = Directory(uri=uri, process=process)
    try:
        _wait_until_up(uri, process, time.monotonic() + 20)
        _seed(directory)
        yield directory
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=3389)
    parser.add_argument("--env-file", help="write the platform's LDAP_* settings here, for `make run-sso`")
    arguments = parser.parse_args()
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # wait for them below, so the directory is stopped on the way out
    with running_directory(arguments.port) as directory:
        if arguments.env_file:
            Path(arguments.env_file).write_text(
                "".join(f"export {name}={shlex.quote(value)}\n" for name, value in directory.settings().items())
            )
        print(
            f"LDAP directory at {directory.uri} (pid {directory.pid}); people: {', '.join(PEOPLE_ENTRIES)}, "
            f"password {PASSWORD}",
            flush=True,
        )
        signal.sigwait(stop)


if __name__ == "__main__":
    main()
