"""Admin helpers shared by every app's operator console: actions with a reason, efficient sidebar filters."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Model, QuerySet
from django.template.response import TemplateResponse

from config.errors import DomainError


class ReasonForm(forms.Form):
    """Intermediate page of an admin action that needs a reason for the audit record."""

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=2000)


def apply_to_each(modeladmin: admin.ModelAdmin, request, queryset: QuerySet, change, verb: str) -> None:
    """Run a service on each selected object; report how many succeeded and each refusal by name."""
    done = 0
    for obj in queryset:
        try:
            change(obj)
        except DomainError as refusal:
            modeladmin.message_user(request, f"{obj}: {refusal.message}", messages.WARNING)
        else:
            done += 1
    if done:
        modeladmin.message_user(request, f"{verb} {done} {_plural(queryset.model, done)}.", messages.SUCCESS)


def _plural(model: type[Model], count: int) -> str:
    return model._meta.verbose_name if count == 1 else model._meta.verbose_name_plural


def action_with_reason(*, name: str, description: str, verb: str, permission: str, change, affected=None):
    """An admin action that asks for a reason first, then calls `change(obj, reason, actor)` on each row.
    `affected(queryset)`, when given, lists who the action hits beyond the selected rows (dicts with request, owner,
    project, node, devices, outcome), shown on the confirm page so the operator sees the blast radius first."""

    def action(modeladmin: admin.ModelAdmin, request, queryset: QuerySet):
        form = ReasonForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            reason = form.cleaned_data["reason"]
            apply_to_each(modeladmin, request, queryset, lambda obj: change(obj, reason, request.user), verb)
            return None
        context = {
            **modeladmin.admin_site.each_context(request),
            "title": description,
            "form": form,
            "queryset": queryset,
            "action_name": name,
            "opts": modeladmin.model._meta,
            "selected_field": helpers.ACTION_CHECKBOX_NAME,
            "affected": affected(queryset) if affected else None,
        }
        return TemplateResponse(request, "admin/action_with_reason.html", context)

    action.__name__ = name
    return admin.action(description=description, permissions=[permission])(action)


def related_list_filter(*select_related: str) -> type[admin.RelatedFieldListFilter]:
    """A related-field sidebar filter whose choice labels load in one query (their __str__ follows relations)."""

    class RelatedListFilter(admin.RelatedFieldListFilter):
        def field_choices(self, field, request, model_admin):
            queryset = field.related_model._default_manager.select_related(*select_related)
            ordering = self.field_admin_ordering(field, request, model_admin)
            if ordering:
                queryset = queryset.order_by(*ordering)
            return [(obj.pk, str(obj)) for obj in queryset]

    return RelatedListFilter


class ReadOnlyAdminMixin:
    """Rows that change only through services (or never): the console shows them and edits nothing."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
