"""The sequence a scheduling cycle advances when it finds another cycle running (see scheduling.cycle)."""

from django.db import migrations

SEQUENCE = "scheduling_cycle_wakeup"


def create_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":  # SQLite runs one cycle at a time without a lock
        schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")


def drop_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0008_preemption_cross_tenant")]

    operations = [migrations.RunPython(create_sequence, drop_sequence)]
