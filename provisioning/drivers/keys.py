"""The SSH keys a requester's account accepts on what the platform delivers, a container workspace or a bare-metal
lease alike: the order's ssh_public_key, when one was given, and every key on the requester's profile as it is now
(tenancy.ssh_keys: a key removed there is not installed any more), read when the account is set up."""

from config.ssh_keys import ssh_public_key_problem
from provisioning.drivers.base import StepError, Target
from tenancy.ssh_keys import authorized_keys_of


def requester_keys(target: Target) -> list[str]:
    """The key lines, the order's first, each once (one query). An order's key that breaks the platform's key rule
    (an order checked before the rule was) fails the step for good."""
    ordered = ((target.snapshot.get("parameters") or {}).get("ssh_public_key") or "").strip()
    problem = ordered and ssh_public_key_problem(ordered)
    if problem:
        raise StepError("ssh_public_key_invalid", f"The order's ssh_public_key {problem}.", retryable=False)
    return list(dict.fromkeys([*([ordered] if ordered else []), *authorized_keys_of(username=target.requester)]))
