"""The cycle outcome's `nodes` now writes each make of node once ({"kinds", "nodes"}, scheduling/outcome.py): the
row an earlier cycle wrote (a list per node) is dropped. Until the next cycle writes it again the order preview
places the queue as it does before any cycle has run."""

from django.db import migrations


def forget_outcome(apps, schema_editor):
    apps.get_model("scheduling", "CycleOutcome").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0021_cluster_change_log")]

    operations = [migrations.RunPython(forget_outcome, migrations.RunPython.noop)]
