"""API tokens (tenancy.api_tokens): stored hashed, expiring, revocable by operators (audited); tokens from before
hashing are hashed by migration 0007 and keep working until their new expiry."""

import hashlib
import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.utils import timezone
from django_q.models import Schedule

from tenancy import tasks
from tenancy.models import ApiToken, AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db
PROJECTS = "/api/v1/projects/"
TOKENS = "/admin/tenancy/apitoken/"
hashing = importlib.import_module("tenancy.migrations.0007_api_tokens_hashed_and_expiring")
scoping = importlib.import_module("tenancy.migrations.0009_directory_sign_in_and_scoped_tokens")


def test_the_migration_hashes_the_plain_text_keys_and_drops_their_table(api, roles, settings):
    legacy_key = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, user_id bigint)")
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s)", [legacy_key, roles.developer.pk])

    with connection.schema_editor() as editor:
        hashing.hash_legacy_tokens(apps, editor)
        scoping.earlier_tokens_keep_every_scope(apps, editor)  # as migrating on does

    assert "authtoken_token" not in connection.introspection.table_names()
    token = ApiToken.objects.get(user=roles.developer)
    assert token.hashed == hashlib.sha256(legacy_key.encode()).hexdigest() and token.prefix == legacy_key[:12]
    assert abs(token.expires_at - (timezone.now() + timedelta(days=settings.API_TOKEN_DEFAULT_DAYS))) < timedelta(
        minutes=1
    )
    api.credentials(HTTP_AUTHORIZATION=f"Token {legacy_key}")
    assert api.get(PROJECTS).status_code == 200  # callers keep working until the new expiry
    api.credentials(HTTP_AUTHORIZATION=f"Token {legacy_key[:-1]}0")
    assert api.get(PROJECTS).status_code == 401


def test_the_migration_does_nothing_on_a_database_without_the_old_table():
    with connection.schema_editor() as editor:
        hashing.hash_legacy_tokens(apps, editor)
    assert not ApiToken.objects.exists()


def test_an_operator_revokes_a_token_with_a_reason_and_it_stops_working_at_once(api, client, roles):
    secret = factories.token_for(roles.developer)
    token = ApiToken.objects.get(user=roles.developer)
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert api.get(PROJECTS).status_code == 200

    client.force_login(roles.approver)
    assert client.get(TOKENS).status_code == 302  # developers never reach the console
    client.force_login(roles.operator)
    listing = client.get(TOKENS).content.decode()
    assert token.prefix in listing and secret not in listing and token.hashed not in listing
    client.post(
        TOKENS,
        {"action": "revoke_api_tokens", ACTION_CHECKBOX_NAME: [token.pk], "apply": "1", "reason": "laptop stolen"},
    )

    assert api.get(PROJECTS).status_code == 401
    audit = AuditEvent.objects.get(action="api_token.revoked")
    assert (audit.actor, audit.reason, audit.data) == (roles.operator, "laptop stolen", {"token": token.prefix})


def test_the_tokens_changelist_reads_a_constant_number_of_queries(client, roles, django_assert_max_num_queries):
    client.force_login(roles.operator)
    for user in (roles.developer, roles.approver, roles.lead):
        factories.token_for(user)
    with django_assert_max_num_queries(12) as few:
        client.get(TOKENS)
    for _ in range(10):
        factories.token_for(factories.UserFactory())
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(TOKENS).status_code == 200


def test_tokens_that_ended_long_ago_are_purged_daily_and_their_audit_rows_stay(roles, settings):
    settings.API_TOKEN_RETENTION_DAYS = 30
    for _ in range(4):
        factories.token_for(roles.developer)
    live, fresh_expired, old_expired, old_revoked = ApiToken.objects.order_by("id")
    now = timezone.now()
    ApiToken.objects.filter(pk=fresh_expired.pk).update(expires_at=now - timedelta(days=29))
    ApiToken.objects.filter(pk=old_expired.pk).update(expires_at=now - timedelta(days=31))
    ApiToken.objects.filter(pk=old_revoked.pk).update(revoked_at=now - timedelta(days=31))

    assert tasks.purge_api_tokens() == 2

    assert set(ApiToken.objects.values_list("pk", flat=True)) == {live.pk, fresh_expired.pk}
    assert AuditEvent.objects.filter(action="api_token.issued").count() == 4
    schedule = Schedule.objects.get(func="tenancy.tasks.purge_api_tokens")
    assert (schedule.schedule_type, schedule.repeats) == (Schedule.DAILY, -1)
