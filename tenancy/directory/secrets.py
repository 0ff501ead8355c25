"""The one directory secret the platform keeps: each OIDC account's refresh token, with which the sync asks the IdP
for the person's current groups. Encrypted (Fernet) with a key derived from SECRET_KEY, so a database dump alone
does not hold usable tokens; rotating SECRET_KEY makes the stored ones unreadable, which the sync treats as having
none (the person's next sign-in stores a new one)."""

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    key = hashlib.sha256(b"compute-catalog directory refresh tokens:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def sealed(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode() if secret else ""


def opened(stored: str) -> str:
    if not stored:
        return ""
    try:
        return _fernet().decrypt(stored.encode()).decode()
    except InvalidToken:
        return ""
