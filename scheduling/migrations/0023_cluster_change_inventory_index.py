"""The newest change of the inventory (nodes, devices, slice tables) in one index read: the order checks' "has the
inventory changed?" (scheduling/estimate.py) takes the highest id of the change log's rows not about allocations,
instead of counting every node and device. PostgreSQL only, as the change log is."""

from django.db import migrations

INDEX = "scheduling_cluster_change_inventory_idx"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"CREATE INDEX {INDEX} ON scheduling_cluster_change (id) WHERE kind <> 'allocation'")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0022_cycle_outcome_node_makes")]

    operations = [migrations.RunPython(create, drop)]
