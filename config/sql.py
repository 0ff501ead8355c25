"""Set-based SQL the ORM does not express well, written once for PostgreSQL and the embedded SQLite."""

from collections.abc import Sequence

from django.db import connection

BATCH = 5000


def update_from_values(
    *, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence], set_sql: str, set_params: Sequence = ()
) -> None:
    """UPDATE `table` from a list of rows: `UPDATE ... FROM v WHERE table.id = v.id`. `columns` are (name,
    PostgreSQL type) with "id" first; `set_sql` refers to the rows as `v.<name>` and may use %s placeholders filled
    from `set_params`. On PostgreSQL one statement with one array per column (`unnest`): a few parameters however
    many rows, which psycopg and the server parse far faster than a VALUES list of rows x columns placeholders; on
    SQLite a VALUES list per batch."""
    if not rows:
        return
    names = ", ".join(name for name, _ in columns)
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in columns)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {set_sql} FROM unnest({arrays}) AS v({names}) WHERE {table}.id = v.id",
                [*set_params, *(list(column) for column in zip(*rows, strict=True))],
            )
        return
    row_sql = "(" + ", ".join(["%s"] * len(columns)) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), BATCH):
            batch = rows[start : start + BATCH]
            cursor.execute(
                f"WITH v({names}) AS (VALUES {', '.join([row_sql] * len(batch))}) "
                f"UPDATE {table} SET {set_sql} FROM v WHERE {table}.id = v.id",
                [value for row in batch for value in row] + list(set_params),
            )


def reserve_id(model) -> int:
    """The id the next row of `model` will have, taken now, for a row that must name its own id before it is
    written (one INSERT instead of an INSERT and an UPDATE). PostgreSQL draws it from the table's sequence; SQLite,
    whose write transactions hold the whole database from their start (config/settings.py), takes the next one up."""
    table, column = model._meta.db_table, model._meta.pk.column
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, %s))", [table, column])
        else:
            cursor.execute(f"SELECT COALESCE(MAX({column}), 0) + 1 FROM {table}")
        return cursor.fetchone()[0]
