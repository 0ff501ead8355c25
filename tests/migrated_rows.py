"""The rows the migrations leave in a fresh test database (content types, permissions, groups, standard vendors),
loaded again after a flush emptied the tables."""

from django.apps import apps
from django.core.management.color import no_style
from django.db import connection


def migrated_rows_reload() -> None:
    """As serialized rollback loads them (from the copy taken when the test database was made), then each table's id
    sequence moved past its rows, as loaddata does: a flush may have reset the sequences, and the rows come back
    under their old ids."""
    connection.creation.deserialize_db_from_string(connection._test_serialized_contents)
    statements = connection.ops.sequence_reset_sql(no_style(), apps.get_models(include_auto_created=True))
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
