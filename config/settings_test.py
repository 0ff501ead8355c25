"""Test settings: the production settings on a local PostgreSQL unless DATABASE_URL says otherwise."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/compute_catalog")
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key")
os.environ.setdefault("SECURE_COOKIES", "0")

from config.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user creation in tests
STORAGES["staticfiles"]["BACKEND"] = "django.contrib.staticfiles.storage.StaticFilesStorage"  # noqa: F405
Q_CLUSTER = {**Q_CLUSTER, "sync": True}  # noqa: F405  tasks run inline so tests see their effects
