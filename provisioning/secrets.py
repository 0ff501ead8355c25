"""Where secrets referenced by name (a node's `bmc_credentials_ref` and `ssh_credentials_ref`) are resolved.

Records hold only the name; the values live in settings (filled from the environment or a secret store), so the
database, the API and step outputs never see them.
"""

from django.conf import settings


def bmc_credentials(ref: str) -> tuple[str, str] | None:
    """(username, password) for the named BMC secret, or None when the name is empty or unknown."""
    entry = getattr(settings, "BMC_CREDENTIALS", {}).get(ref) if ref else None
    if not entry:
        return None
    return entry["username"], entry["password"]


def ssh_credentials(ref: str) -> tuple[str, str] | None:
    """(username, private key file) for the named SSH secret (Node.ssh_credentials_ref), or None when the name is
    empty or unknown. The key stays in its file: only its path reaches ansible-playbook."""
    entry = getattr(settings, "SSH_CREDENTIALS", {}).get(ref) if ref else None
    if not entry:
        return None
    return entry["username"], entry["private_key_file"]
