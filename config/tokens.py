"""Secrets that are shown once and stored only as a SHA-256 hash: project API keys, agent tokens, installer tokens.

A prefixed secret reads `<kind>_<prefix>_<random>`: the public prefix finds the row, the hash of the whole secret
proves it, compared in constant time.
"""

import hashlib
import hmac
import re
import secrets

_PREFIX = re.compile(r"[0-9a-f]{1,12}")


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode(errors="surrogatepass")).hexdigest()


def secret_matches(hashed: str, secret: str) -> bool:
    return hmac.compare_digest(hashed, secret_hash(secret))


def prefixed_secret_new(kind: str) -> tuple[str, str]:
    """A fresh (prefix, secret) pair; store the prefix and `secret_hash(secret)`, show the secret once."""
    prefix = secrets.token_hex(4)
    return prefix, f"{kind}_{prefix}_{secrets.token_urlsafe(32)}"


def prefixed_secret_prefix(kind: str, secret: str) -> str | None:
    """The public prefix of a secret of this kind, or None when it is not shaped like one (so nothing odd, e.g. a
    NUL byte, ever reaches a query)."""
    parts = secret.split("_", 2)
    return parts[1] if len(parts) == 3 and parts[0] == kind and _PREFIX.fullmatch(parts[1]) else None
