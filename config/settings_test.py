"""Test settings: the production settings on a local PostgreSQL unless DATABASE_URL says otherwise."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/compute_catalog")
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key")
os.environ.setdefault("SECURE_COOKIES", "0")
# The test client and the test servers speak plain HTTP on the loopback.
os.environ.setdefault("SECURE_SSL_REDIRECT", "0")
os.environ.setdefault("SECURE_HSTS_SECONDS", "0")
os.environ.setdefault("METRICS_TOKEN", "tests-only-metrics-token")

from config.env import env_bool, env_float
from config.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user creation in tests
STORAGES["staticfiles"]["BACKEND"] = "django.contrib.staticfiles.storage.StaticFilesStorage"  # noqa: F405
# Tasks run inline so tests see their effects; a worker process started by a test (Q_SYNC=0) uses the broker.
Q_CLUSTER = {**Q_CLUSTER, "sync": env_bool("Q_SYNC", default=True)}  # noqa: F405
# Simulated provisioning runs instantly and retries quickly unless a test (or its subprocess) says otherwise.
PROVISIONING_SIMULATED_SPEED = env_float("PROVISIONING_SIMULATED_SPEED", 0.0)
PROVISIONING_BACKOFF_SECONDS = env_float("PROVISIONING_BACKOFF_SECONDS", 0.01)
# Tasks run inline, so the task that asks a backend out of reach again asks once; a test following an outage asks
# again itself (or sets more).
PROVISIONING_OUTAGE_WATCH_SECONDS = env_float("PROVISIONING_OUTAGE_WATCH_SECONDS", 0.0)
