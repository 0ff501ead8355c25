"""A real OpenID Connect provider on the loopback for the OIDC sign-in tests and `make run-sso`: oidc-provider-mock
(PyPI), a Flask/authlib server that runs the authorization code flow, refresh tokens, userinfo and RP-initiated
logout over HTTP, with a page where the person says who they are (their `sub`). It runs from its own venv
(`make oidc-venv`, .venv-oidc) as a subprocess, started and stopped by PID. Its ID tokens name no key (`kid`), so the
relying party is given its signing key (OIDC_IDP_SIGN_KEY), as the platform's docs say for such IdPs.

People's claims are set over its API (`set_person`); `reset()` puts the test people back and ends their grants.
Run alone (`python -m devcluster.oidc_provider --port 9400`) it serves the demo's IdP until interrupted.
"""

import argparse
import json
import shlex
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-oidc" / "bin" / "python"
CLIENT_ID, CLIENT_SECRET = "compute-catalog", "oidc-client-secret"

# sub -> claims: the IdP's people (the same as the test directory's, devcluster/ldap_directory.py).
PEOPLE = {
    "alice": {
        "preferred_username": "alice",
        "email": "alice@example.org",
        "given_name": "Alice",
        "family_name": "Archer",
        "groups": ["ml-engineers", "research"],
    },
    "bob": {
        "preferred_username": "bob",
        "email": "bob@example.org",
        "given_name": "Bob",
        "family_name": "Builder",
        "groups": ["research"],
    },
    "carol": {
        "preferred_username": "carol",
        "email": "carol@example.org",
        "given_name": "Carol",
        "family_name": "Chen",
        "groups": ["research-approvers"],
    },
    "dave": {
        "preferred_username": "dave",
        "email": "dave@example.org",
        "given_name": "Dave",
        "family_name": "Dalton",
        "groups": ["platform-ops"],
    },
}


@dataclass
class IdentityProvider:
    url: str
    process: subprocess.Popen
    signing_key_pem: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def settings(self) -> dict:
        """Environment variables that point the platform at this IdP (config/settings.py, OIDC_*)."""
        return {
            "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_DISCOVERY_URL": f"{self.url}/.well-known/openid-configuration",
            "OIDC_IDP_SIGN_KEY": self.signing_key_pem,
            "OIDC_PROVIDER_NAME": "Example SSO",
        }

    def set_person(self, sub: str, claims: dict) -> None:
        httpx.put(f"{self.url}/users/{sub}", json=claims).raise_for_status()

    def end_grants(self, sub: str) -> None:
        """The IdP revokes the person's access and refresh tokens (as when they leave or are disabled)."""
        httpx.post(f"{self.url}/users/{sub}/revoke-tokens").raise_for_status()

    def reset(self) -> None:
        for sub, claims in PEOPLE.items():
            self.end_grants(sub)
            self.set_person(sub, claims)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _signing_key_pem(url: str) -> str:
    [key] = httpx.get(f"{url}/jwks").raise_for_status().json()["keys"]
    public = jwt.PyJWK(key).key
    from cryptography.hazmat.primitives import serialization

    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _wait_until_up(url: str, process: subprocess.Popen, deadline: float) -> None:
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"oidc-provider-mock exited with {process.returncode}: {process.stderr.read()[-2000:]}")
        try:
            httpx.get(f"{url}/.well-known/openid-configuration", timeout=1).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise RuntimeError("oidc-provider-mock did not answer within 30 s") from None
            time.sleep(0.05)  # polling a starting server, with a deadline


@contextmanager
def running_provider(port: int | None = None):
    if not PYTHON.exists():
        raise RuntimeError("The IdP's venv is missing: `make oidc-venv` (part of `make test`) creates .venv-oidc")
    port = port or _free_port()
    url = f"http://127.0.0.1:{port}"
    people = [f"--user-claims={json.dumps({'sub': sub, **claims})}" for sub, claims in PEOPLE.items()]
    process = subprocess.Popen(
        [str(PYTHON), "-m", "oidc_provider_mock", "--host", "127.0.0.1", "--port", str(port), *people],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "PYTHONWARNINGS": "ignore"},
    )
    try:
        _wait_until_up(url, process, time.monotonic() + 30)
        yield IdentityProvider(url=url, process=process, signing_key_pem=_signing_key_pem(url))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--env-file", help="write the platform's OIDC_* settings here, for `make run-sso`")
    arguments = parser.parse_args()
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    with running_provider(arguments.port) as provider:
        if arguments.env_file:
            Path(arguments.env_file).write_text(
                "".join(f"export {name}={shlex.quote(value)}\n" for name, value in provider.settings().items())
            )
        print(f"OIDC provider at {provider.url} (pid {provider.pid}); people: {', '.join(PEOPLE)}", flush=True)
        signal.sigwait(stop)


if __name__ == "__main__":
    main()
