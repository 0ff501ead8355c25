"""Stored secrets that are shown again (config/encryption.py): encrypted under SECRETS_ENCRYPTION_KEYS, or keys derived
from SECRET_KEY and its fallbacks; a key rotation keeps them readable and re-encrypts them under the new key."""

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from config.encryption import Undecryptable, decrypt, encrypt, reencrypted


def test_a_secret_comes_back_and_is_not_in_its_ciphertext(settings):
    settings.SECRETS_ENCRYPTION_KEYS = []
    stored = encrypt("the-token")

    assert decrypt(stored) == "the-token"
    assert "the-token" not in stored and encrypt("the-token") != stored  # a fresh IV each time


def test_keys_derived_from_secret_key_follow_django_s_key_rotation(settings):
    settings.SECRETS_ENCRYPTION_KEYS, settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = [], "old-key", []
    stored = encrypt("the-token")

    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-key", ["old-key"]
    assert decrypt(stored) == "the-token"
    moved = reencrypted(stored)
    settings.SECRET_KEY_FALLBACKS = []
    assert decrypt(moved) == "the-token"
    with pytest.raises(Undecryptable):
        decrypt(stored)


def test_configured_keys_encrypt_with_the_first_and_decrypt_with_any(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.SECRETS_ENCRYPTION_KEYS = [old]
    stored = encrypt("the-token")

    settings.SECRETS_ENCRYPTION_KEYS = [new, old]
    assert decrypt(stored) == "the-token"
    settings.SECRETS_ENCRYPTION_KEYS = [new]
    with pytest.raises(Undecryptable):
        decrypt(stored)
    settings.SECRETS_ENCRYPTION_KEYS = [new, old]
    moved = reencrypted(stored)
    settings.SECRETS_ENCRYPTION_KEYS = [new]
    assert decrypt(moved) == "the-token"


def test_a_key_that_is_no_fernet_key_is_a_configuration_error(settings):
    settings.SECRETS_ENCRYPTION_KEYS = ["not-a-key"]

    with pytest.raises(ImproperlyConfigured, match="SECRETS_ENCRYPTION_KEYS"):
        encrypt("the-token")
