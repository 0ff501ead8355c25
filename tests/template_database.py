"""The migrated database every test database is copied from (PostgreSQL's CREATE DATABASE ... TEMPLATE), built once
per set of migrations and kept on the server between runs, as pip keeps its wheels: migrating from nothing costs each
pytest process about 20 seconds of CPU, a copy under one. Its name carries a fingerprint of every migration file and
the Django version, so a changed, added or removed migration (or another Django release) makes a new one, and the old
ones that no running pytest copies from are dropped; Django still runs `migrate` on the copy (nothing left to apply)
and its post_migrate handlers, so those always run as the checkout has them."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import django
import psycopg
from psycopg import sql

from config.env import database_url

REPO = Path(__file__).resolve().parent.parent
PREFIX = "cc_tests_template_"
LOCK_KEY = 7_405_193  # pg_advisory_lock: one process builds, the others wait for it


# The connection that holds this process's shared lock on the template it copies from, open until the process ends.
_in_use: list[psycopg.Connection] = []


def migrated_template(database: dict) -> str:
    """The name of the template for this checkout's migrations on `database`'s server, built when missing. The
    process holds a shared lock on it until it ends, so a run of another checkout (other migrations, another Django)
    never drops it while this run still copies from it."""
    name = PREFIX + _fingerprint()
    server = _server(database)
    _in_use.append(server)
    server.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
    try:
        server.execute("SELECT pg_advisory_lock_shared(%s)", [_use_key(name)])
        if not _exists(server, name):
            _build(server, database, name)
    finally:
        server.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
    return name


def _use_key(template: str) -> int:
    """The advisory lock key of a template (or of its half-built copy): 60 bits of its fingerprint."""
    return int(template[len(PREFIX) : len(PREFIX) + 15], 16)


def _fingerprint() -> str:
    digest = hashlib.sha256(django.__version__.encode())
    for path in sorted(REPO.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _server(database: dict) -> psycopg.Connection:
    return psycopg.connect(
        dbname="postgres",
        host=database["HOST"] or "127.0.0.1",
        port=database["PORT"] or 5432,
        user=database["USER"],
        password=database.get("PASSWORD") or None,
        autocommit=True,
    )


def _exists(server: psycopg.Connection, name: str) -> bool:
    return server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def _build(server: psycopg.Connection, database: dict, name: str) -> None:
    """Migrate a database under a building name, then rename it: a build that dies half-way is never used."""
    drop_unused_templates(server)
    building = name + "_building"
    server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
        cwd=REPO,
        env={**os.environ, "DATABASE_URL": database_url({**database, "NAME": building})},
        check=True,
    )
    server.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(building), sql.Identifier(name)))


def drop_unused_templates(server: psycopg.Connection) -> None:
    """Drop the templates (and half-built ones) that no running pytest process holds a lock on."""
    for (stale,) in server.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [PREFIX + "%"]).fetchall():
        if server.execute("SELECT pg_try_advisory_lock(%s)", [_use_key(stale)]).fetchone()[0]:
            server.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(stale)))
            server.execute("SELECT pg_advisory_unlock(%s)", [_use_key(stale)])
