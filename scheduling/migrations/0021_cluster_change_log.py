"""The cluster change log: triggers note every write that changes what the placement engine sees (nodes, devices,
allocations, slice tables, a request's duration), so a scheduler process can keep its cluster state between cycles
and re-read only what changed (scheduling/cluster_state.py). Triggers, not service code, so that bulk updates and
operator SQL are seen too. PostgreSQL only: on SQLite every cycle reads the whole cluster."""

from django.db import migrations

LOG = "scheduling_cluster_change"

# (table, kind, the id the change is about, columns whose change matters to the engine or None for any)
WATCHED = [
    ("scheduling_node", "node", "id", "name, cpu_milli, memory_mib, schedulable"),
    ("scheduling_device", "node", "node_id", "node_id, index, model_id, memory_gb, health, isolated"),
    (
        "scheduling_allocation",
        "allocation",
        "id",
        "state, node_id, cpu_milli, memory_mib, priority, preemptible, started_at, term_started_at",
    ),
    ("scheduling_allocationdevice", "allocation", "allocation_id", "allocation_id, device_id, milli"),
    ("catalog_sliceprofile", "all", "0", None),
]


def _triggers(table: str, kind: str, key: str, columns: str | None) -> list[str]:
    """Statement-level triggers over the transition tables (one INSERT into the log per statement, however many
    rows a bulk write touches); an update is noted only when one of `columns` changed, with old and new ids."""
    name = f"{table}_cc"
    key_of = (lambda alias: "0") if key == "0" else (lambda alias: f"{alias}.{key}")
    changed = (
        "TRUE"
        if columns is None
        else f"({', '.join('n.' + c.strip() for c in columns.split(','))}) IS DISTINCT FROM "
        f"({', '.join('o.' + c.strip() for c in columns.split(','))})"
    )
    bodies = {
        "INSERT": ("NEW TABLE AS n", f"SELECT '{kind}', {key_of('n')} FROM n"),
        "DELETE": ("OLD TABLE AS o", f"SELECT '{kind}', {key_of('o')} FROM o"),
        "UPDATE": (
            "OLD TABLE AS o NEW TABLE AS n",
            f"SELECT '{kind}', {key_of('n')} FROM n JOIN o USING (id) WHERE {changed} "
            f"UNION SELECT '{kind}', {key_of('o')} FROM n JOIN o USING (id) WHERE {changed}",
        ),
    }
    statements = []
    for event, (referencing, select) in bodies.items():
        function = f"{name}_{event.lower()}"
        statements.append(
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO {LOG} (kind, object_id) SELECT DISTINCT * FROM ({select}) AS changes; RETURN NULL; END $$"
        )
        statements.append(
            f"CREATE TRIGGER {function} AFTER {event} ON {table} REFERENCING {referencing} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
    return statements


# Row-level with a WHEN clause, for tables whose many other updates must cost nothing: (table, trigger name, the
# columns, the rows to log for NEW)
ROW_WATCHED = [
    # An approved extension changes when the allocation ends (ENDS_AT is derived from the request).
    (
        "requests_resourcerequest",
        "requests_resourcerequest_cc_duration",
        ["duration_hours"],
        "SELECT 'allocation', id FROM scheduling_allocation WHERE request_id = NEW.id",
    ),
    # A renamed model (or one moved to another vendor) changes every device of it as the engine sees it.
    (
        "catalog_acceleratormodel",
        "catalog_acceleratormodel_cc_slug",
        ["slug", "vendor_id"],
        "SELECT DISTINCT 'node', node_id FROM scheduling_device WHERE model_id = NEW.id",
    ),
]


def _row_trigger(table: str, name: str, columns: list[str], select: str) -> list[str]:
    changed = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in columns)
    return [
        f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN INSERT INTO {LOG} (kind, object_id) {select}; RETURN NULL; END $$",
        f"CREATE TRIGGER {name} AFTER UPDATE OF {', '.join(columns)} ON {table} FOR EACH ROW WHEN ({changed}) "
        f"EXECUTE FUNCTION {name}()",
    ]


def create_log(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE TABLE {LOG} (id bigserial PRIMARY KEY, kind varchar(12) NOT NULL, object_id bigint NOT NULL, "
        "xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT now())"
    )
    schema_editor.execute(f"CREATE INDEX {LOG}_xid ON {LOG} (xid)")
    schema_editor.execute(f"CREATE INDEX {LOG}_at ON {LOG} (at)")
    for watched in WATCHED:
        for statement in _triggers(*watched):
            schema_editor.execute(statement)
    for watched in ROW_WATCHED:
        for statement in _row_trigger(*watched):
            schema_editor.execute(statement)


def drop_log(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, *_ in WATCHED:
        for event in ("insert", "delete", "update"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_cc_{event} ON {table}")
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {table}_cc_{event}()")
    schema_editor.execute("DROP TRIGGER IF EXISTS requests_resourcerequest_cc_duration ON requests_resourcerequest")
    schema_editor.execute("DROP FUNCTION IF EXISTS requests_resourcerequest_cc_duration()")
    schema_editor.execute(f"DROP TABLE IF EXISTS {LOG}")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0020_allocation_replica"),
        ("catalog", "0010_labels_and_choices"),
        ("requests", "0017_labels_and_choices"),
    ]

    operations = [migrations.RunPython(create_log, drop_log)]
