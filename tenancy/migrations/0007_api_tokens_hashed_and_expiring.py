"""API tokens stored hashed and expiring (tenancy.ApiToken) in place of DRF's authtoken table, which kept every key
in plain text. Each existing key is hashed into an ApiToken (prefix: its first 12 characters, which is how
tenancy.api_tokens finds a 40-hex key) expiring API_TOKEN_DEFAULT_DAYS from now, so callers keep working until
then; the plain-text table is dropped."""

import hashlib
from datetime import timedelta

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

LEGACY_TABLE = "authtoken_token"
LEGACY_PREFIX_LENGTH = 12


def hash_legacy_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if LEGACY_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("tenancy", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id FROM {LEGACY_TABLE}")
        rows = cursor.fetchall()
    expires_at = timezone.now() + timedelta(days=settings.API_TOKEN_DEFAULT_DAYS)
    ApiToken.objects.bulk_create(
        [
            ApiToken(
                user_id=user_id,
                name="API sign-in (from before tokens were hashed)",
                prefix=key[:LEGACY_PREFIX_LENGTH],
                hashed=hashlib.sha256(key.encode()).hexdigest(),
                expires_at=expires_at,
            )
            for key, user_id in rows
        ]
    )
    schema_editor.execute(f"DROP TABLE {LEGACY_TABLE}")


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0006_labels_and_choices'),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(help_text="What uses it, e.g. a laptop's CLI or a CI pipeline.", max_length=80)),
                ('prefix', models.CharField(help_text='Public part of the token, to tell tokens apart.', max_length=12, unique=True)),
                ('hashed', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('expires_at', models.DateTimeField(db_index=True)),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'API token',
                'ordering': ['-created_at', '-id'],
                'indexes': [models.Index(fields=['user', '-created_at'], name='api_token_user_idx')],
            },
        ),
        migrations.RunPython(hash_legacy_tokens, migrations.RunPython.noop),
    ]
