"""The Operators group holds exactly what the apps declare in `operator_permissions`, nothing more."""

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission

from tenancy.operators import OPERATOR_GROUP, operator_permission_names, sync_operator_group

pytestmark = pytest.mark.django_db


def declared_permissions() -> set[str]:
    return {name for config in apps.get_app_configs() for name in getattr(config, "operator_permissions", ())}


def group_permissions(group: Group) -> set[str]:
    return {
        f"{app_label}.{codename}"
        for app_label, codename in group.permissions.values_list("content_type__app_label", "codename")
    }


def test_operator_group_holds_exactly_the_declared_permissions():
    group = sync_operator_group()

    assert group.name == OPERATOR_GROUP
    assert group_permissions(group) == declared_permissions()
    assert operator_permission_names() == declared_permissions()


def test_every_declared_permission_exists():
    group = sync_operator_group()

    assert group.permissions.count() == len(declared_permissions())


def test_declared_permissions_cover_tenancy_and_catalog():
    names = declared_permissions()

    assert {"tenancy.view_project", "tenancy.change_projectquota", "catalog.change_service"} <= names


def test_sync_is_idempotent():
    first = group_permissions(sync_operator_group())
    second = group_permissions(sync_operator_group())

    assert first == second
    assert Group.objects.filter(name=OPERATOR_GROUP).count() == 1


def test_sync_removes_a_permission_added_by_hand():
    group = sync_operator_group()
    delete_project = Permission.objects.get(content_type__app_label="tenancy", codename="delete_project")
    group.permissions.add(delete_project)

    group = sync_operator_group()

    assert "tenancy.delete_project" not in group_permissions(group)
    assert group_permissions(group) == declared_permissions()


def test_operators_cannot_delete_catalog_entries():
    group = sync_operator_group()

    catalog = group.permissions.filter(content_type__app_label="catalog")
    assert not catalog.filter(codename__startswith="delete_").exists()
    assert catalog.filter(codename__startswith="change_").exists()


def test_operators_cannot_delete_projects_tenants_or_quotas():
    held = group_permissions(sync_operator_group())

    forbidden = {
        "tenancy.delete_project",
        "tenancy.delete_tenant",
        "tenancy.delete_projectquota",
        "tenancy.delete_tenantquota",
        "tenancy.delete_auditevent",
        "tenancy.change_auditevent",
    }
    assert held.isdisjoint(forbidden)
