# The change counter the approval policy tables bump (config/versions.py): a process keeps the active rules it
# routes orders by (requests.approvals.matching_rule) until it moves.

from django.db import migrations

from config.versions import counted


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0012_catalog_change_counter"),
        ("requests", "0018_committed_demand_index"),
    ]

    operations = [
        counted(
            "approval_policies",
            [
                "requests_approvalpolicy",
                "requests_approvalrule",
                "requests_approvalrulestage",
                "requests_approvalrulestage_users",
            ],
        )
    ]
