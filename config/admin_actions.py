"""Admin helpers shared by every app's operator console: actions with a reason, buttons on change pages that go
through a service behind a confirmation, efficient sidebar filters."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

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


class CommentForm(forms.Form):
    """An object action whose note is optional (an approval's comment)."""

    reason = forms.CharField(
        label="Comment", required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=2000
    )


@dataclass(frozen=True)
class ObjectAction:
    """A button on a change page: `available(request, obj)` decides whether it shows (and whether its URL answers);
    GET asks for confirmation with `consequences(obj)` in words and a reason, POST calls `act(obj, reason, actor)`
    (a service) and redirects back to the change page with the outcome or the refusal as a message."""

    name: str
    label: str
    available: Callable[[Any, Any], bool]
    act: Callable[[Any, str, Any], Any]
    done: str
    consequences: Callable[[Any], list[str]] = lambda obj: []
    reason_required: bool = True
    danger: bool = False


class ObjectActionsMixin:
    """Action buttons on a read-only change page, each going through a service behind a confirmation step."""

    object_actions: list[ObjectAction] = []
    change_form_template = "admin/change_form_with_actions.html"

    def get_urls(self):
        meta = self.model._meta
        act = path(
            "<path:object_id>/act/<str:action>/",
            self.admin_site.admin_view(self.object_action_view),
            name=f"{meta.app_label}_{meta.model_name}_act",
        )
        return [act, *super().get_urls()]

    def _action_url(self, obj, action: ObjectAction) -> str:
        meta = self.model._meta
        return reverse(f"admin:{meta.app_label}_{meta.model_name}_act", args=[obj.pk, action.name])

    def change_view(self, request, object_id, form_url="", extra_context=None):
        obj = self.get_object(request, object_id)
        buttons = (
            [
                {
                    "label": action.label,
                    "url": self._action_url(obj, action),
                    "name": action.name,
                    "danger": action.danger,
                }
                for action in self.object_actions
                if action.available(request, obj)
            ]
            if obj is not None
            else []
        )
        return super().change_view(request, object_id, form_url, {"object_actions": buttons, **(extra_context or {})})

    def object_action_view(self, request, object_id, action):
        obj = self.get_object(request, object_id)
        chosen = next((candidate for candidate in self.object_actions if candidate.name == action), None)
        if obj is None or chosen is None:
            raise Http404("No such object or action.")
        if not self.has_view_permission(request, obj) or not chosen.available(request, obj):
            raise PermissionDenied("This action is not open to you on this object now.")
        meta = self.model._meta
        back = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
        form_class = ReasonForm if chosen.reason_required else CommentForm
        form = form_class(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                chosen.act(obj, form.cleaned_data["reason"], request.user)
            except DomainError as refusal:
                self.message_user(request, f"{obj}: {refusal.message}", messages.ERROR)
            else:
                self.message_user(request, f"{obj}: {chosen.done}.", messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{chosen.label}: {obj}",
            "opts": meta,
            "object": obj,
            "action": chosen,
            "consequences": chosen.consequences(obj),
            "form": form,
            "back_url": back,
        }
        return TemplateResponse(
            request, "admin/object_action_confirm.html", context, status=400 if form.is_bound else 200
        )
