"""The serving tables take serving's names (provisioning_apikey -> serving_apikey, ...; rows, ids and foreign keys
stay), and what is stored about them follows them:

- their content types change app label (provisioning -> serving) in place, so what points at them keeps pointing
  at them: their permissions (the Operators group's, any user's or guardian's), admin log entries and the audit
  trail's rows about keys (`AuditEvent.target_type`);
- the django-q2 schedule of the replicas' health check runs `serving.tasks.check_replicas` (was
  `provisioning.tasks.check_replicas`). A check queued under the old name before the upgrade fails once; the next
  minute's runs under the new one.
"""

from django.db import migrations

MODELS = ("servingdeployment", "servingreplica", "apikey")
TASKS = {"provisioning.tasks.check_replicas": "serving.tasks.check_replicas"}


def _relabel(apps, old: str, new: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        moving = ContentType.objects.filter(app_label=old, model=model).first()
        if moving is None:  # a fresh database: post_migrate creates them under the new label
            continue
        # One made under the new label by a migrate that stopped before this migration holds only the default
        # permissions, made again for the moving one; the moving one keeps its id and everything pointing at it.
        ContentType.objects.filter(app_label=new, model=model).delete()
        moving.app_label = new
        moving.save(update_fields=["app_label"])


def _rename_tasks(apps, names: dict[str, str]) -> None:
    Schedule = apps.get_model("django_q", "Schedule")
    for old, new in names.items():
        if Schedule.objects.filter(func=new).exists():  # post_migrate made it already: the old one would fail
            Schedule.objects.filter(func=old).delete()
        else:
            Schedule.objects.filter(func=old).update(func=new)


def forwards(apps, schema_editor):
    _relabel(apps, "provisioning", "serving")
    _rename_tasks(apps, TASKS)


def backwards(apps, schema_editor):
    _relabel(apps, "serving", "provisioning")
    _rename_tasks(apps, {new: old for old, new in TASKS.items()})


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0001_initial"),
        ("provisioning", "0011_serving_models_moved_to_serving"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [
        migrations.AlterModelTable(name="servingdeployment", table=None),
        migrations.AlterModelTable(name="servingreplica", table=None),
        migrations.AlterModelTable(name="apikey", table=None),
        migrations.RunPython(forwards, backwards),
    ]
