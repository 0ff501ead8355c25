"""OpenSSH public key lines: the one rule for what the platform accepts as a key (an order's ssh_public_key, a key on
a person's profile, and again where a workspace installs them), and the fingerprint ssh-keygen -l shows."""

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

# The key types OpenSSH's authorized_keys accepts (ssh-keygen -Q key-plain).
SSH_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ssh-dss",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
SSH_KEY_LINE = re.compile(r"(?P<type>\S+) (?P<blob>[A-Za-z0-9+/]+={0,2})(?: (?P<comment>[^\x00-\x1f\x7f]*))?")
PRIVATE_KEY_MARK = "PRIVATE KEY-----"
QUOTED_LENGTH = 64


class NotAPublicKey(ValueError):
    """Why a text is not one public key line, as the end of a sentence ("The key <problem>.")."""


@dataclass(frozen=True)
class PublicKey:
    type: str
    blob: str
    comment: str

    @property
    def line(self) -> str:
        """The line authorized_keys takes, without the comment's surrounding space."""
        return f"{self.type} {self.blob}" + (f" {self.comment}" if self.comment else "")

    @property
    def fingerprint(self) -> str:
        """SHA256:... as `ssh-keygen -l` prints it."""
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _quoted(text: str) -> str:
    return text if len(text) <= QUOTED_LENGTH else text[:QUOTED_LENGTH] + "…"


def public_key_parse(key: str) -> PublicKey:
    """The key line `<type> <base64 key> [comment]`, the type one authorized_keys accepts and the one the key itself
    names, no options, no second line, no control characters; NotAPublicKey otherwise (a private key is named as
    such, and never quoted)."""
    if PRIVATE_KEY_MARK in key:
        raise NotAPublicKey("is a private key: give the public key (the .pub file's line), and keep the private one")
    line = SSH_KEY_LINE.fullmatch(key.strip())
    if line is None:
        raise NotAPublicKey(
            "must be one OpenSSH public key line: <type> <base64 key> [comment], with no control characters"
        )
    if line["type"] not in SSH_KEY_TYPES:
        raise NotAPublicKey(f"has the key type {_quoted(line['type'])}; accepted: {', '.join(sorted(SSH_KEY_TYPES))}")
    try:
        blob = base64.b64decode(line["blob"], validate=True)
        (length,) = struct.unpack(">I", blob[:4])
        named = blob[4 : 4 + length].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError) as error:
        raise NotAPublicKey("does not hold a key: its second word is not an OpenSSH key in base64") from error
    if named != line["type"]:
        raise NotAPublicKey(f"says {line['type']} but holds a {_quoted(named) or 'different'} key")
    return PublicKey(type=line["type"], blob=line["blob"], comment=(line["comment"] or "").strip())


def ssh_public_key_problem(key: str) -> str | None:
    """Why `key` is not one OpenSSH public key line (public_key_parse's rule), or None."""
    try:
        public_key_parse(key)
    except NotAPublicKey as problem:
        return str(problem)
    return None
