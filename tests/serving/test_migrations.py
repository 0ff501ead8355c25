"""Serving's models left provisioning with their rows: the tables are renamed, and what is stored about them (content
types with the permissions on them, the replicas' health-check schedule) follows them."""

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django_q.models import Schedule

from serving.models import ApiKey
from tests import factories

BEFORE = ("provisioning", "0010_step_outage_and_forced_release")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_moving_keeps_the_rows_their_content_types_permissions_and_schedule():
    project = factories.project()
    holder = factories.UserFactory()
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE, ("serving", None)])
    try:  # whatever fails here, the schema goes forward again for the tests after this one
        others = [node for node in executor.loader.graph.leaf_nodes() if node[0] not in ("provisioning", "serving")]
        old = executor.loader.project_state([*others, BEFORE]).apps
        old_type = old.get_model("contenttypes", "ContentType").objects.get(app_label="provisioning", model="apikey")
        key = old.get_model("provisioning", "ApiKey").objects.create(
            project_id=project.pk, name="ci", prefix="cc_abcdef", hashed="0" * 64
        )
        permission = old.get_model("auth", "Permission").objects.get(content_type=old_type, codename="view_apikey")
        holder_row = old.get_model("tenancy", "User").objects.get(pk=holder.pk)
        holder_row.user_permissions.add(permission)
        # The schedule post_migrate made, as a database from before the move holds it. Updated, not deleted and created
        # again: a serialized rollback restores rows with their ids and leaves the id sequence behind them.
        Schedule.objects.update_or_create(
            name="Health-check serving replicas", defaults={"func": "provisioning.tasks.check_replicas"}
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        ContentType.objects.clear_cache()

    assert ApiKey._meta.db_table == "serving_apikey"
    assert ApiKey.objects.get(pk=key.pk).prefix == "cc_abcdef"
    moved = ContentType.objects.get_for_model(ApiKey)
    assert (moved.pk, moved.app_label) == (old_type.pk, "serving")
    assert not ContentType.objects.filter(app_label="provisioning", model="apikey").exists()
    assert Permission.objects.get(pk=permission.pk).content_type_id == old_type.pk
    assert type(holder).objects.get(pk=holder.pk).has_perm("serving.view_apikey")
    assert list(Schedule.objects.filter(func__endswith=".check_replicas").values_list("func", flat=True)) == [
        "serving.tasks.check_replicas"
    ]
