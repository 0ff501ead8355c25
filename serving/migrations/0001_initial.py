"""Serving's models, moved from provisioning: their tables stay as they are here (state only, no SQL), named by
their old names until 0002_tables_and_content_types_from_provisioning renames them; provisioning's
0011_serving_models_moved_to_serving drops them from provisioning's state."""

import django.db.models.deletion
import django_fsm
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('provisioning', '0010_step_outage_and_forced_release'),
        ('requests', '0026_event_codes_backend_wait'),
        ('scheduling', '0028_device_mig_mode_wanted'),
        ('tenancy', '0009_directory_sign_in_and_scoped_tokens'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name='ApiKey',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=80)),
                        ('prefix', models.CharField(max_length=12, unique=True)),
                        ('hashed', models.CharField(max_length=64)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('expires_at', models.DateTimeField(blank=True, help_text='Set when rotated: the key keeps working until then (the grace period its owner chose).', null=True)),
                        ('created_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_keys', to='tenancy.project')),
                        ('replaced_by', models.OneToOneField(blank=True, help_text='Set when rotated.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='replaces', to='serving.apikey')),
                    ],
                    options={
                        'verbose_name': 'API key',
                        'db_table': 'provisioning_apikey',
                        'ordering': ['project', '-created_at'],
                    },
                ),
                migrations.CreateModel(
                    name='ServingDeployment',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('slug', models.SlugField(max_length=80, unique=True)),
                        ('model_name', models.CharField(help_text='The model id clients send, as /v1/models lists it.', max_length=160)),
                        ('state', django_fsm.FSMField(choices=[('deploying', 'Deploying'), ('serving', 'Serving'), ('stopped', 'Stopped')], default='deploying', max_length=10, protected=True)),
                        ('rate_limit_per_minute', models.PositiveIntegerField(help_text='Requests per minute per API key.')),
                        ('monthly_token_budget', models.PositiveBigIntegerField(blank=True, help_text='Input + output tokens a month; empty = none.', null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('stopped_at', models.DateTimeField(blank=True, null=True)),
                        ('project', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='deployments', to='tenancy.project')),
                        ('request', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='deployment', to='requests.resourcerequest')),
                    ],
                    options={
                        'ordering': ['-created_at'],
                        'db_table': 'provisioning_servingdeployment',
                    },
                    bases=(django_fsm.ConcurrentTransitionMixin, models.Model),
                ),
                migrations.CreateModel(
                    name='ServingReplica',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=40)),
                        ('url', models.URLField(blank=True, help_text="Where the gateway sends this replica's traffic.", verbose_name='URL')),
                        ('pid', models.PositiveIntegerField(blank=True, null=True)),
                        ('devices', models.JSONField(blank=True, default=list)),
                        ('healthy', models.BooleanField(default=False)),
                        ('checked_at', models.DateTimeField(blank=True, null=True)),
                        ('last_error', models.CharField(blank=True, max_length=300)),
                        ('allocation', models.ForeignKey(blank=True, help_text='The allocation (node and devices) the replica runs on.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='serving_replicas', to='scheduling.allocation')),
                        ('deployment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='replicas', to='serving.servingdeployment')),
                    ],
                    options={
                        'ordering': ['deployment', 'name'],
                        'db_table': 'provisioning_servingreplica',
                        'constraints': [models.UniqueConstraint(fields=('deployment', 'name'), name='replica_name_unique')],
                    },
                ),
            ],
        ),
    ]
