"""How a person reaches a delivered workspace from their own machine: the ssh command, an ssh_config block and the
links that open it in VS Code (Remote - SSH) and JetBrains Gateway. Made from what the workspace's delivery recorded
(host, SSH port, account) when the request is read, for the Connect panel, the API and the `cc` command line alike."""

from urllib.parse import urlencode


def ide_access(*, request_id: int, delivered: dict) -> dict | None:
    """{ssh_argv, ssh_config, vscode, jetbrains_gateway} for a workspace reached by SSH, else None (a Slurm job, a
    bare-metal server, an endpoint, or a delivery from before the account was recorded)."""
    host, user = delivered.get("host"), delivered.get("user")
    port = (delivered.get("ports") or {}).get("ssh")
    if not (host and user and port):
        return None
    home = f"/home/{user}"
    gateway = urlencode(
        {"type": "ssh", "deploy": "false", "host": host, "port": port, "user": user, "projectPath": home}
    )
    return {
        "ssh_argv": ["ssh", "-p", str(port), f"{user}@{host}"],
        "ssh_config": f"Host cc-{request_id}\n  HostName {host}\n  Port {port}\n  User {user}\n",
        "vscode": f"vscode://vscode-remote/ssh-remote+{user}@{host}:{port}{home}",
        "jetbrains_gateway": f"jetbrains-gateway://connect#{gateway}",
    }
