"""Allocation: a protected django-fsm state, and an end derived from the request's duration instead of a stored
expiry (the term's start is carried over from the stored expiry, which extensions had already moved)."""

from datetime import timedelta

import django.utils.timezone
import django_fsm
from django.db import migrations, models


def term_from_expiry(apps, schema_editor):
    """The stored expiry already counted every applied extension, as the request's duration does."""
    Allocation = apps.get_model("scheduling", "Allocation")
    allocations = list(Allocation.objects.select_related("request"))
    for allocation in allocations:
        allocation.term_started_at = allocation.expires_at - timedelta(hours=allocation.request.duration_hours)
    Allocation.objects.bulk_update(allocations, ["term_started_at"], batch_size=1000)


class Migration(migrations.Migration):
    dependencies = [
        ("requests", "0011_provisioning_start_events"),
        ("scheduling", "0014_cycleoutcome_waiting"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="term_started_at",
            field=models.DateTimeField(
                default=django.utils.timezone.now,
                help_text="When the request's approved duration started counting: the allocation's start, or the "
                "released allocation's for an operator's retry on the same devices.",
            ),
        ),
        migrations.RunPython(term_from_expiry, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="allocation", name="allocation_state_expiry_idx"),
        migrations.RemoveField(model_name="allocation", name="expires_at"),
        migrations.AlterField(
            model_name="allocation",
            name="state",
            field=django_fsm.FSMField(
                choices=[("active", "Active"), ("released", "Released")],
                default="active",
                max_length=10,
                protected=True,
            ),
        ),
        migrations.AddIndex(
            model_name="allocation",
            index=models.Index(fields=["state", "term_started_at"], name="allocation_state_term_idx"),
        ),
    ]
