"""The Operators group: staff who run hardware, quotas and the catalog from the admin.

Each app lists what its operators may do as `operator_permissions` on its AppConfig; after every migrate
the group is set to exactly the union, so a new app or model widens the group without a hand edit.
"""

from django.apps import apps
from django.contrib.auth.models import Group, Permission

OPERATOR_GROUP = "Operators"


def operator_permission_names() -> set[str]:
    names: set[str] = set()
    for config in apps.get_app_configs():
        names.update(getattr(config, "operator_permissions", ()))
    return names


def sync_operator_group(**_kwargs) -> Group:
    """The Operators group with exactly the installed apps' operator permissions. The permissions are matched in
    Python over one read of the table: a filter of one OR per permission took the database longer to plan than to run,
    and every operator a test makes syncs the group."""
    group, _ = Group.objects.get_or_create(name=OPERATOR_GROUP)
    wanted = operator_permission_names()
    every = Permission.objects.values_list("pk", "content_type__app_label", "codename")
    group.permissions.set([pk for pk, app_label, codename in every if f"{app_label}.{codename}" in wanted])
    return group
