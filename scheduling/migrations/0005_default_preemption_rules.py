"""Default preemption rules; operators edit or deactivate them in the admin. Reversing removes only these rows."""

from django.db import migrations

DEFAULT_RULES = [
    # preemptor, victim, grace period in seconds
    ("critical", "batch", 300),
    ("critical", "standard", 300),
    ("high", "batch", 600),
]


def add_rules(apps, schema_editor):
    PreemptionRule = apps.get_model("scheduling", "PreemptionRule")
    for preemptor, victim, grace in DEFAULT_RULES:
        PreemptionRule.objects.get_or_create(preemptor=preemptor, victim=victim,
                                             defaults={"grace_period_seconds": grace})


def remove_rules(apps, schema_editor):
    PreemptionRule = apps.get_model("scheduling", "PreemptionRule")
    for preemptor, victim, _grace in DEFAULT_RULES:
        PreemptionRule.objects.filter(preemptor=preemptor, victim=victim).delete()


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0004_preemption_rules")]

    operations = [migrations.RunPython(add_rules, remove_rules)]
