"""Change counters of tables that change rarely but are read on every order (the catalog, the approval policies).

A database trigger on each counted table gives its counter a new value in the writing transaction, whoever writes
and however (the admin, a service, a bulk update, raw SQL). A process keeps what it built from those tables
(`KeptPerProcess`) and builds it again only when the counter has another value: one indexed read of one row instead
of the queries the build costs. The counter is read before the build, so a change committed during a build is seen
by the next use.

The values are never reused, not even after a rollback: a process may have built from its own uncommitted rows, and
a later change must not come back to the value it kept them under. PostgreSQL draws them from a sequence (which a
rollback does not give back); SQLite, the demo's database, has no sequences and draws a random 64-bit number.
"""

from collections.abc import Callable
from typing import Generic, TypeVar

from django.db import connection, migrations

TABLE = "version_counter"
T = TypeVar("T")


def counter_table() -> migrations.RunPython:
    """The migration operation creating the counters' table (one row per counter, made by `counted`)."""

    def forwards(apps, schema_editor):
        schema_editor.execute(f"CREATE TABLE {TABLE} (name varchar(40) PRIMARY KEY, value bigint NOT NULL)")
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"CREATE SEQUENCE {TABLE}_seq")

    def backwards(apps, schema_editor):
        schema_editor.execute(f"DROP TABLE {TABLE}")
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"DROP SEQUENCE {TABLE}_seq")

    return migrations.RunPython(forwards, backwards)


def counted(counter: str, tables: list[str]) -> migrations.RunPython:
    """The migration operation that makes every write to `tables` bump `counter` (PostgreSQL: one trigger per table
    and statement; SQLite: one per table and kind of write)."""

    def forwards(apps, schema_editor):
        schema_editor.execute(f"INSERT INTO {TABLE} (name, value) VALUES (%s, 0)", [counter])
        for statement in _triggers(schema_editor.connection.vendor, counter, tables):
            schema_editor.execute(statement)

    def backwards(apps, schema_editor):
        for statement in _drops(schema_editor.connection.vendor, counter, tables):
            schema_editor.execute(statement)
        schema_editor.execute(f"DELETE FROM {TABLE} WHERE name = %s", [counter])

    return migrations.RunPython(forwards, backwards)


def _bump(vendor: str, counter: str) -> str:
    fresh = f"nextval('{TABLE}_seq')" if vendor == "postgresql" else "random()"
    return f"UPDATE {TABLE} SET value = {fresh} WHERE name = '{counter}'"


def _triggers(vendor: str, counter: str, tables: list[str]) -> list[str]:
    if vendor == "postgresql":
        function = f"{TABLE}_bump_{counter}"
        return [
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {_bump(vendor, counter)}; "
            "RETURN NULL; END $$",
            *(
                f"CREATE TRIGGER {table}_vc_{counter} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
                for table in tables
            ),
        ]
    return [
        f"CREATE TRIGGER {table}_vc_{counter}_{event.lower()} AFTER {event} ON {table} "
        f"BEGIN {_bump(vendor, counter)}; END"
        for table in tables
        for event in ("INSERT", "UPDATE", "DELETE")
    ]


def _drops(vendor: str, counter: str, tables: list[str]) -> list[str]:
    if vendor == "postgresql":
        return [
            *(f"DROP TRIGGER {table}_vc_{counter} ON {table}" for table in tables),
            f"DROP FUNCTION {TABLE}_bump_{counter}()",
        ]
    return [
        f"DROP TRIGGER {table}_vc_{counter}_{event}" for table in tables for event in ("insert", "update", "delete")
    ]


def version(counter: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT value FROM {TABLE} WHERE name = %s", [counter])
        row = cursor.fetchone()
    if row is None:
        raise LookupError(f"No change counter {counter!r}: run the migrations.")
    return row[0]


class KeptPerProcess(Generic[T]):
    """What `build` makes from the tables under `counter`, kept in this process while the counter stays put.
    The value is shared by every caller in the process: treat it as read-only."""

    def __init__(self, counter: str, build: Callable[[], T]):
        self.counter, self.build = counter, build
        self._version: int | None = None
        self._value: T | None = None

    def get(self) -> T:
        current = version(self.counter)
        if current != self._version:
            self._value, self._version = self.build(), current
        return self._value
