"""How to reach a delivered workspace: the ssh command line, an ssh_config block and the IDE links, from the
request's delivered host, SSH port and account (GET /api/v1/requests/{id}/, provisioning.delivered)."""

from dataclasses import dataclass
from urllib.parse import urlencode


@dataclass(frozen=True)
class SshTarget:
    user: str
    host: str
    port: int
    alias: str  # the ssh_config Host name, e.g. cc-42

    @property
    def command(self) -> list[str]:
        return ["ssh", "-p", str(self.port), f"{self.user}@{self.host}"]

    @property
    def home(self) -> str:
        return f"/home/{self.user}"

    def ssh_config(self) -> str:
        return f"Host {self.alias}\n  HostName {self.host}\n  Port {self.port}\n  User {self.user}\n"

    def vscode_link(self) -> str:
        return f"vscode://vscode-remote/ssh-remote+{self.user}@{self.host}:{self.port}{self.home}"

    def jetbrains_link(self) -> str:
        query = urlencode(
            {"type": "ssh", "deploy": "false", "host": self.host, "port": self.port, "user": self.user}
            | {"projectPath": self.home}
        )
        return f"jetbrains-gateway://connect#{query}"

    def as_data(self) -> dict:
        return {
            "ssh": " ".join(self.command),
            "ssh_config": self.ssh_config(),
            "vscode": self.vscode_link(),
            "jetbrains_gateway": self.jetbrains_link(),
        }


def ssh_target(request: dict) -> SshTarget | None:
    """The workspace's SSH target while it is active, else None (not delivered yet, or no SSH: a Slurm job, an
    endpoint)."""
    delivered = ((request.get("provisioning") or {}).get("delivered")) or {}
    port = (delivered.get("ports") or {}).get("ssh")
    if not (delivered.get("host") and port and delivered.get("user")):
        return None
    return SshTarget(user=delivered["user"], host=delivered["host"], port=int(port), alias=f"cc-{request['id']}")
