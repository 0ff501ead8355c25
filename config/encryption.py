"""Secrets the platform must show again (a workspace's Jupyter token) are stored encrypted, never in clear.

Fernet (AES-128-CBC with HMAC-SHA256, from the `cryptography` package) under the keys of SECRETS_ENCRYPTION_KEYS
(comma-separated Fernet keys, the first encrypts, every one decrypts, so a key is rotated by putting a new one first
and running `manage.py reencrypt_secrets`); when that setting is empty, under keys derived from SECRET_KEY and each of
SECRET_KEY_FALLBACKS (HKDF-SHA256 with a label of its own), so rotating SECRET_KEY as Django rotates it keeps them
readable. Something only compared (API keys, installer tokens) is hashed instead (config/tokens.py).
"""

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DERIVATION_LABEL = b"compute-catalog stored secrets v1"


class Undecryptable(Exception):
    """Stored under a key the platform no longer has, or altered."""


def encrypt(text: str) -> str:
    return _box().encrypt(text.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _box().decrypt(token.encode()).decode()
    except InvalidToken as unreadable:
        raise Undecryptable("No configured key decrypts this secret.") from unreadable


def reencrypted(token: str) -> str:
    """The same secret under the first key (after a key rotation)."""
    try:
        return _box().rotate(token.encode()).decode()
    except InvalidToken as unreadable:
        raise Undecryptable("No configured key decrypts this secret.") from unreadable


def _box() -> MultiFernet:
    configured = [key for key in settings.SECRETS_ENCRYPTION_KEYS if key]
    if configured:
        try:
            return MultiFernet([Fernet(key) for key in configured])
        except ValueError as malformed:
            raise ImproperlyConfigured(
                "SECRETS_ENCRYPTION_KEYS holds a key that is not a Fernet key (32 url-safe base64-encoded bytes)."
            ) from malformed
    secret_keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return MultiFernet([Fernet(_derived(secret_key)) for secret_key in secret_keys])


def _derived(secret_key: str) -> bytes:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=DERIVATION_LABEL).derive(secret_key.encode())
    return base64.urlsafe_b64encode(key)
