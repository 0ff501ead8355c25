"""ServingDeployment, ServingReplica and ApiKey now belong to the serving app (serving/0001_initial): they leave
provisioning's state only; their tables and rows stay (serving/0002_tables_and_content_types_from_provisioning
renames them)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0010_step_outage_and_forced_release"),
        ("serving", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.DeleteModel(name="ServingReplica"),
                migrations.DeleteModel(name="ServingDeployment"),
                migrations.DeleteModel(name="ApiKey"),
            ],
        ),
    ]
