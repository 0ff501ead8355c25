"""The Operators group: staff who run hardware, quotas and the catalog from the admin.

Each app lists what its operators may do as `operator_permissions` on its AppConfig; after every migrate
the group is set to exactly the union, so a new app or model widens the group without a hand edit.
"""

from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.db.models import Q

OPERATOR_GROUP = "Operators"


def operator_permission_names() -> set[str]:
    names: set[str] = set()
    for config in apps.get_app_configs():
        names.update(getattr(config, "operator_permissions", ()))
    return names


def sync_operator_group(**_kwargs) -> Group:
    group, _ = Group.objects.get_or_create(name=OPERATOR_GROUP)
    wanted = Q(pk__in=[])
    for name in operator_permission_names():
        app_label, codename = name.split(".", 1)
        wanted |= Q(content_type__app_label=app_label, codename=codename)
    group.permissions.set(Permission.objects.filter(wanted))
    return group
