"""Preemption crosses tenants only where an operator's rule says so: existing and seeded rules stay within one."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0007_agent_tokens'),
    ]

    operations = [
        migrations.AddField(
            model_name='preemptionrule',
            name='cross_tenant',
            field=models.BooleanField(default=False, help_text="Also evict other tenants' allocations. Off: only the waiting request's own tenant's work.", verbose_name='across tenants'),
        ),
    ]
