"""The one admin mixin for configuration that operators edit: every add, edit and delete is audited.

It covers the change page, the changelist's editable columns, the delete page, the bulk "delete selected"
action and inline rows. Apps whose saves need their own checks override `entry_save` with their service.
"""

from django.db import models, transaction

from tenancy import services
from tenancy.models import User


class AuditedAdminMixin:
    """Saves and deletes of the entry and of its inline rows go through audited services."""

    def entry_save(self, entry: models.Model, changed_fields: list[str], actor: User) -> models.Model:
        return services.configuration_save(entry=entry, changed_fields=changed_fields, actor=actor)

    def entry_delete(self, entry: models.Model, actor: User) -> None:
        services.configuration_delete(entry=entry, actor=actor)

    def save_model(self, request, obj, form, change):
        if change and not form.has_changed():
            return  # saved for its inline rows only: the entry itself did not change, so no audit row for it
        self.entry_save(obj, form.changed_data, request.user)

    def delete_model(self, request, obj):
        self.entry_delete(obj, request.user)

    @transaction.atomic
    def delete_queryset(self, request, queryset):
        """The bulk action deletes row by row, so each deleted row has its audit row (all or none)."""
        for entry in queryset:
            self.entry_delete(entry, request.user)

    def save_formset(self, request, form, formset, change):
        formset.save(commit=False)  # sets new_objects, changed_objects and deleted_objects without saving
        for entry in formset.deleted_objects:
            self.entry_delete(entry, request.user)
        changed = [(entry, []) for entry in formset.new_objects] + list(formset.changed_objects)
        for entry, fields in changed:
            self.entry_save(entry, fields, request.user)
        formset.save_m2m()
