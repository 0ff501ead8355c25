"""Set-based SQL (config.sql): one UPDATE from many rows, each row set from its own values."""

import json

import pytest
from django.db import connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from config.sql import update_from_values

PROBE_TABLE = "CREATE TEMP TABLE sql_probe (id bigint PRIMARY KEY, n int, data jsonb, at timestamptz, note text)"
COLUMNS = [("id", "bigint"), ("n", "integer"), ("data", "jsonb"), ("at", "timestamp with time zone")]


def _probe_rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, n, data, at, note FROM sql_probe ORDER BY id")
        rows = cursor.fetchall()
    # Django has psycopg hand jsonb over as text (JSONField decodes it).
    return [(pk, n, data if data is None else json.loads(data), at, note) for pk, n, data, at, note in rows]


@pytest.mark.django_db
def test_one_update_sets_each_row_from_its_own_values_nulls_json_and_times_included(django_assert_num_queries):
    with connection.cursor() as cursor:
        cursor.execute(PROBE_TABLE)
        cursor.execute("INSERT INTO sql_probe (id, n, note) SELECT g, 0, 'kept' FROM generate_series(1, 4) g")
    at = timezone.now()
    with django_assert_num_queries(1):  # JSON as text, as the queue status writes it
        update_from_values(
            table="sql_probe",
            columns=COLUMNS,
            rows=[(1, None, json.dumps({"code": "x"}), at), (3, 7, json.dumps([1, "y"]), None)],
            set_sql="n = v.n, data = v.data, at = v.at, note = %s",
            set_params=["set"],
        )
    with django_assert_num_queries(1):  # JSON as the ORM prepares it, as the provisioning steps write it
        update_from_values(
            table="sql_probe", columns=COLUMNS, rows=[(4, 2, Jsonb({"k": None}), at)], set_sql="data = v.data, n = v.n"
        )
    assert _probe_rows() == [
        (1, None, {"code": "x"}, at, "set"),
        (2, 0, None, None, "kept"),
        (3, 7, [1, "y"], None, "set"),
        (4, 2, {"k": None}, None, "kept"),
    ]
