"""Operator console for tenants, projects, memberships and quotas. Every save goes through a service."""

from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt
from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.db.models import Count, Exists, OuterRef, Q
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from guardian.admin import GuardedModelAdmin

from config.admin_actions import ReadOnlyAdminMixin, action_with_reason
from config.errors import DomainError
from tenancy import api_tokens, services, sign_in
from tenancy.audited_admin import AuditedAdminMixin
from tenancy.choices import OrderCap, QuotaDimension, Role
from tenancy.directory import rights
from tenancy.models import (
    ApiToken,
    AuditEvent,
    DirectoryAccount,
    DirectoryGrant,
    GroupMapping,
    Invitation,
    Membership,
    Project,
    ProjectQuota,
    ServiceAccount,
    Tenant,
    TenantQuota,
    User,
)

QUOTA_FIELDS = tuple(QuotaDimension.values)
ENTITLEMENT = "max_priority"  # project quotas only: the highest priority class ordered without approval
ORDER_CAP_FIELDS = tuple(cap.field for cap in OrderCap)  # project quotas only: overrides of the platform's caps


class UserChangeForm(DjangoUserAdmin.form):
    def clean_manager(self):
        manager = self.cleaned_data.get("manager")
        try:
            services.manager_chain_check(user=self.instance, manager=manager)
        except DomainError as refusal:
            raise forms.ValidationError(refusal.message) from refusal
        return manager


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    form = UserChangeForm
    list_display = ["username", "email", "first_name", "last_name", "manager", "is_staff", "is_active"]
    list_select_related = ["manager"]
    autocomplete_fields = ["manager"]
    fieldsets = [*DjangoUserAdmin.fieldsets, ("Organisation", {"fields": ["manager"]})]

    def save_model(self, request, obj, form, change):
        services.user_save(user=obj, changed_fields=form.changed_data, actor=request.user)


class QuotaForm(forms.ModelForm):
    """Admin form (the admin supplies model and fields): a quota edit needs a reason, like every operator action;
    it goes on the audit row. A form whose limits did not change needs none (an untouched inline)."""

    reason = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Why the limits change; required for any change, recorded on the audit row.",
    )

    def clean(self):
        cleaned = super().clean()
        edited = [field for field in self.changed_data if field != "reason"]
        if edited and not cleaned.get("reason", "").strip():
            self.add_error("reason", "Give a reason for this quota change; it goes on the audit record.")
        return cleaned


class TenantQuotaInline(admin.StackedInline):
    model = TenantQuota
    form = QuotaForm
    fields = (*QUOTA_FIELDS, "reason")
    can_delete = False
    extra = 0


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    ordering = ["name"]  # the count annotation drops Meta.ordering; autocomplete pages need a stable order
    list_display = ["name", "slug", "active", "project_count"]
    list_filter = ["active"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [TenantQuotaInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(project_count=Count("projects"))

    @admin.display(ordering="project_count", description="Projects")
    def project_count(self, tenant):
        return tenant.project_count

    def save_model(self, request, obj, form, change):
        if change:
            services.tenant_update(tenant=obj, changed_fields=form.changed_data, actor=request.user)
        else:
            created = services.tenant_create(
                name=obj.name, slug=obj.slug, description=obj.description, actor=request.user
            )
            obj.pk = created.pk

    def save_formset(self, request, form, formset, change):
        _save_quota_formset(request, formset, owner=form.instance)
        _saved_through_services(formset)


def _saved_through_services(formset) -> None:
    """The admin's history message reads what a formset saved itself; these inlines save through services, so
    say what their forms changed (without this, saving the page fails with AttributeError: no new_objects)."""
    changed = [inline for inline in formset.forms if inline.has_changed() and inline.is_valid()]
    formset.deleted_objects = [inline.instance for inline in changed if inline.cleaned_data.get("DELETE")]
    formset.new_objects = [
        inline.instance for inline in changed if not inline.instance.pk and not inline.cleaned_data.get("DELETE")
    ]
    formset.changed_objects = [
        (inline.instance, inline.changed_data)
        for inline in changed
        if inline.instance.pk and not inline.cleaned_data.get("DELETE")
    ]


def _save_quota_formset(request, formset, *, owner) -> None:
    """Quota inlines never save themselves: quota_set records every changed limit."""
    for quota_form in formset.forms:
        if not quota_form.has_changed() or not quota_form.is_valid():
            continue
        limits = {field: quota_form.cleaned_data.get(field) for field in QUOTA_FIELDS}
        quota = quota_form.instance if quota_form.instance.pk else _quota_row(owner, request.user)
        _save_quota(request, quota, limits, quota_form)


def _save_quota(request, quota, limits: dict, form) -> None:
    """Limits through quota_set, a project's priority entitlement through its own service: both audited with the
    operator's reason."""
    reason = form.cleaned_data["reason"].strip()
    services.quota_set(quota=quota, limits=limits, actor=request.user, reason=reason)
    if ENTITLEMENT in form.changed_data:
        services.quota_set_priority_entitlement(
            quota=quota, max_priority=form.cleaned_data[ENTITLEMENT], actor=request.user, reason=reason
        )
    caps = {cap.value: form.cleaned_data[cap.field] for cap in OrderCap if cap.field in form.changed_data}
    if caps:
        services.quota_set_order_caps(quota=quota, caps=caps, actor=request.user, reason=reason)


def _quota_row(owner, actor):
    if isinstance(owner, Tenant):
        return services.tenant_quota_ensure(tenant=owner, actor=actor)
    return owner.quota


class MembershipInlineFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        lead = self.instance.lead if self.instance.lead_id else None
        for form in self.forms:
            user = form.cleaned_data.get("user")
            if lead is None or user != lead:
                continue
            if form.cleaned_data.get("DELETE") or form.cleaned_data.get("role") != Role.LEAD:
                raise forms.ValidationError(f"{lead} leads this project; appoint another lead first.")


class MembershipInline(admin.TabularInline):
    model = Membership
    formset = MembershipInlineFormSet
    fk_name = "project"
    fields = ["user", "role", "granted_by", "created_at"]
    readonly_fields = ["granted_by", "created_at"]
    autocomplete_fields = ["user"]
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user", "granted_by")


class ProjectQuotaInline(admin.StackedInline):
    model = ProjectQuota
    form = QuotaForm
    fields = (ENTITLEMENT, *QUOTA_FIELDS, *ORDER_CAP_FIELDS, "reason")
    readonly_fields = ["updated_by"]
    can_delete = False
    extra = 0


@admin.register(Project)
class ProjectAdmin(GuardedModelAdmin):
    """Projects with their members and quota. The object-permission page shows who holds what;
    permissions themselves follow membership roles and are changed only through memberships."""

    ordering = ["tenant__name", "name"]
    list_display = ["name", "tenant", "lead", "cost_centre", "active", "member_count"]
    list_filter = ["active", "tenant"]
    list_select_related = ["tenant", "lead"]
    search_fields = ["name", "slug", "cost_centre", "tenant__name", "lead__username"]
    autocomplete_fields = ["tenant", "lead"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [ProjectQuotaInline, MembershipInline]
    actions = ["deactivate_projects", "activate_projects"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(ordering="member_count", description="Members")
    def member_count(self, project):
        return project.member_count

    def save_model(self, request, obj, form, change):
        if not change:
            created = services.project_create(
                tenant=obj.tenant,
                name=obj.name,
                slug=obj.slug,
                lead=obj.lead,
                cost_centre=obj.cost_centre,
                description=obj.description,
                actor=request.user,
            )
            obj.pk = created.pk
            return
        changes = {field: form.cleaned_data[field] for field in form.changed_data}
        if changes:
            services.project_update(project=Project.objects.get(pk=obj.pk), actor=request.user, **changes)

    def save_formset(self, request, form, formset, change):
        if formset.model is ProjectQuota:
            _save_quota_formset(request, formset, owner=form.instance)
        else:
            _save_membership_formset(request, formset, project=Project.objects.get(pk=form.instance.pk))
        _saved_through_services(formset)

    def obj_perms_manage_user_view(self, request, object_pk, user_id):
        return self._permissions_follow_roles(request, object_pk)

    def obj_perms_manage_group_view(self, request, object_pk, group_id):
        return self._permissions_follow_roles(request, object_pk)

    def _permissions_follow_roles(self, request, object_pk):
        self.message_user(
            request,
            "Project permissions follow membership roles: change the member's role on the project instead.",
            messages.WARNING,
        )
        return redirect(reverse("admin:tenancy_project_change", args=[object_pk]))

    deactivate_projects = action_with_reason(
        name="deactivate_projects",
        description="Deactivate selected projects (no new requests)",
        verb="Deactivated",
        permission="change",
        change=lambda project, reason, actor: services.project_update(
            project=project, actor=actor, reason=reason, active=False
        ),
    )
    activate_projects = action_with_reason(
        name="activate_projects",
        description="Reactivate selected projects",
        verb="Reactivated",
        permission="change",
        change=lambda project, reason, actor: services.project_update(
            project=project, actor=actor, reason=reason, active=True
        ),
    )


def _save_membership_formset(request, formset, *, project: Project) -> None:
    for membership_form in formset.forms:
        if not membership_form.has_changed() or not membership_form.cleaned_data:
            continue
        user = membership_form.cleaned_data["user"]
        if user == project.lead:
            continue  # the lead's role follows the project's lead field
        if membership_form.cleaned_data.get("DELETE"):
            services.membership_revoke(project=project, user=user, actor=request.user)
        else:
            services.membership_grant(
                project=project, user=user, role=membership_form.cleaned_data["role"], actor=request.user
            )


class MembershipForm(forms.ModelForm):
    def clean(self):
        cleaned = super().clean()
        user = cleaned.get("user") or (self.instance.user if self.instance.user_id else None)
        project = cleaned.get("project") or (self.instance.project if self.instance.project_id else None)
        if user and project and project.lead_id == user.pk and cleaned.get("role") != Role.LEAD:
            raise forms.ValidationError(f"{user} leads {project.slug}; appoint another lead first.")
        return cleaned


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    form = MembershipForm
    list_display = ["user", "project", "role", "source", "granted_by", "created_at"]
    list_filter = ["role", "project__tenant"]
    list_select_related = ["user", "project__tenant", "granted_by"]

    def get_queryset(self, request):
        given = DirectoryGrant.objects.filter(user=OuterRef("user_id"), project=OuterRef("project_id"))
        return super().get_queryset(request).annotate(from_directory=Exists(given))

    @admin.display(description="Granted", ordering="from_directory")
    def source(self, membership):
        return "by directory group" if membership.from_directory else "by hand"

    search_fields = ["user__username", "project__name", "project__slug"]
    autocomplete_fields = ["user", "project"]
    readonly_fields = ["granted_by", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        fixed = ["user", "project"] if obj is not None else []
        return [*fixed, *self.readonly_fields]

    def save_model(self, request, obj, form, change):
        granted = services.membership_grant(project=obj.project, user=obj.user, role=obj.role, actor=request.user)
        obj.pk = granted.pk

    def get_deleted_objects(self, objs, request):
        """A project lead's membership follows the project's lead field: deleting it is refused."""
        deleted, counts, refused, protected = super().get_deleted_objects(objs, request)
        pairs = {(membership.project_id, membership.user_id) for membership in objs}
        projects = Project.objects.filter(pk__in={project_id for project_id, _ in pairs})
        if pairs.intersection(projects.values_list("pk", "lead_id")):
            refused = {*refused, "the membership of a project's lead (appoint another lead first)"}
        return deleted, counts, refused, protected

    def delete_model(self, request, obj):
        services.membership_revoke(project=obj.project, user=obj.user, actor=request.user)

    def delete_queryset(self, request, queryset):
        for membership in queryset.select_related("project", "user"):
            self.delete_model(request, membership)


class QuotaAdminBase(admin.ModelAdmin):
    form = QuotaForm
    list_display_links = None
    readonly_fields = ["updated_at", "updated_by"]

    def save_model(self, request, obj, form, change):
        limits = {field: form.cleaned_data[field] for field in form.changed_data if field in QUOTA_FIELDS}
        _save_quota(request, type(obj).objects.get(pk=obj.pk), limits, form)

    def has_add_permission(self, request):
        return False  # quota rows come with their project; tenant caps are added on the tenant

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ProjectQuota)
class ProjectQuotaAdmin(QuotaAdminBase):
    list_display = ["project", ENTITLEMENT, *QUOTA_FIELDS, "updated_at"]
    list_display_links = ["project"]
    list_filter = ["project__tenant", ENTITLEMENT]
    list_select_related = ["project__tenant"]
    search_fields = ["project__name", "project__slug"]
    fields = ["project", ENTITLEMENT, *QUOTA_FIELDS, *ORDER_CAP_FIELDS, "reason", "updated_at", "updated_by"]
    readonly_fields = ["project", "updated_at", "updated_by"]


@admin.register(TenantQuota)
class TenantQuotaAdmin(QuotaAdminBase):
    list_display = ["tenant", *QUOTA_FIELDS, "updated_at"]
    list_display_links = ["tenant"]
    list_select_related = ["tenant"]
    search_fields = ["tenant__name"]
    fields = ["tenant", *QUOTA_FIELDS, "reason", "updated_at", "updated_by"]
    readonly_fields = ["tenant", "updated_at", "updated_by"]


class AuditCategoryFilter(admin.SimpleListFilter):
    """Kinds of audit rows, by their action's prefix: sign-ins, directory grants and removals, tokens..."""

    title = "kind"
    parameter_name = "kind"
    CATEGORIES = {
        "sign_in": ("Sign-ins", ["sign_in."]),
        "directory": ("Directory grants and removals", ["directory."]),
        "token": ("API tokens (issue, use, revocation)", ["api_token."]),
        "service_account": ("Service accounts", ["service_account."]),
        "mapping": ("Group mappings", ["groupmapping."]),
    }

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in self.CATEGORIES.items()]

    def queryset(self, request, queryset):
        if self.value() not in self.CATEGORIES:
            return queryset
        matches = Q()
        for prefix in self.CATEGORIES[self.value()][1]:
            matches |= Q(action__startswith=prefix)
        return queryset.filter(matches)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The append-only audit trail of administrative changes."""

    list_display = ["created_at", "action", "target_repr", "target_type", "actor", "reason", "data"]
    list_filter = [AuditCategoryFilter, "action", "target_type"]
    list_select_related = ["actor", "target_type"]
    search_fields = ["target_repr", "action", "actor__username", "reason", "data__username", "data__user"]
    date_hierarchy = "created_at"


@admin.register(Invitation)
class InvitationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Team invitations leads sent from their project's Team page (the link itself is never stored)."""

    list_display = ["email", "project", "role", "invited_by", "created_at", "expires_at", "accepted_by", "revoked_at"]
    list_filter = ["role"]
    list_select_related = ["project__tenant", "invited_by", "accepted_by"]
    search_fields = ["email", "project__name", "invited_by__username"]
    exclude = ["token_prefix", "token_hash"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """People's API tokens (issued at /api/v1/auth/token/): who holds which, until when, last used; operators
    revoke them (audited). The secret is never stored, so it is never shown."""

    list_display = [
        "prefix",
        "name",
        "user",
        "project",
        "scope_list",
        "created_at",
        "expires_at",
        "last_used_at",
        "last_used_from",
        "revoked_at",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), ("project", admin.EmptyFieldListFilter)]
    list_select_related = ["user", "project__tenant"]
    search_fields = ["prefix", "name", "user__username"]
    exclude = ["hashed"]
    actions = [
        action_with_reason(
            name="revoke_api_tokens",
            description="Revoke selected API tokens",
            verb="Revoked",
            permission="revoke",
            change=lambda token, reason, actor: api_tokens.api_token_revoke(token=token, reason=reason, actor=actor),
        )
    ]

    @admin.display(description="Scopes")
    def scope_list(self, token):
        return ", ".join(token.scopes)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # revoked tokens stay for the audit trail

    def has_revoke_permission(self, request):
        return request.user.has_perm("tenancy.change_apitoken")


admin.site.unregister(AccessAttempt)


@admin.register(AccessAttempt)
class SignInLockoutAdmin(AccessAttemptAdmin):
    """django-axes' failed sign-ins per account and address: operators see who is locked out and clear it, with a
    reason on the audit record (plain deletion is not offered: it would leave no trace)."""

    actions = [
        *AccessAttemptAdmin.actions,
        action_with_reason(
            name="clear_sign_in_lockouts",
            description="Clear the sign-in lockout of the selected rows",
            verb="Cleared",
            permission="clear",
            change=lambda attempt, reason, actor: sign_in.sign_in_lockout_clear(
                attempt=attempt, reason=reason, actor=actor
            ),
        ),
    ]

    def has_delete_permission(self, request, obj=None):
        return False

    def has_clear_permission(self, request):
        return request.user.has_perm("axes.delete_accessattempt")


# --- Company sign-in: group mappings, directory accounts, service accounts -------------------------------------


class GroupMappingForm(forms.ModelForm):
    class Meta:
        model = GroupMapping
        fields = ["group", "grant", "tenant", "project", "active", "note"]


@admin.register(GroupMapping)
class GroupMappingAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Which directory groups give which rights. Saving is audited and makes the saving operator the rule's author:
    an operator rule applies only while its author is an operator. "Preview who would get what" lists the people in
    each selected rule's group (as last read) and what the rule does for them, without applying anything: write a
    rule inactive, preview it, then activate it. Rules apply at the next sign-in or sync."""

    form = GroupMappingForm
    list_display = ["group", "grant", "tenant", "project", "active", "written_by", "updated_at"]
    list_filter = ["grant", "active"]
    list_select_related = ["tenant", "project__tenant", "written_by"]
    search_fields = ["group", "note", "project__slug", "tenant__slug"]
    autocomplete_fields = ["tenant", "project"]
    readonly_fields = ["written_by", "created_at", "updated_at", "preview"]
    actions = ["preview_mappings"]

    def entry_save(self, entry, changed_fields, actor):
        entry.written_by = actor
        return services.configuration_save(entry=entry, changed_fields=changed_fields, actor=actor)

    @admin.display(description="Who would get what")
    def preview(self, mapping):
        if mapping.pk is None:
            return "Save the rule (inactive, if you like) to preview it."
        return render_to_string("tenancy/admin/mapping_rows.html", {"rows": _preview_rows([mapping])})

    @admin.action(description="Preview who would get what (applies nothing)", permissions=["view"])
    def preview_mappings(self, request, queryset):
        rows = _preview_rows(list(queryset.select_related("tenant", "project", "written_by")))
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "rows": rows}
        return TemplateResponse(
            request, "tenancy/admin/mapping_preview.html", {**context, "title": "Who would get what"}
        )


def _preview_rows(mappings) -> list[dict]:
    accounts = list(rights.accounts_for_preview())
    return [
        {
            "mapping": mapping,
            "applies": rights.mapping_applies(mapping),
            "people": rights.members_preview(mapping, accounts),
        }
        for mapping in mappings
    ]


class DirectoryGrantInline(admin.TabularInline):
    """What the directory gave the person (rights given by hand are not listed here: they stay whatever groups do)."""

    model = DirectoryGrant
    fields = ["grant", "tenant", "project", "groups", "granted_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant", "project__tenant")


@admin.register(DirectoryAccount)
class DirectoryAccountAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """People who signed in through the company directory: their identity there, the groups they were last seen in,
    and (below) the rights those groups gave them."""

    list_display = ["user", "source", "subject", "groups_read_at", "last_sign_in_at"]
    list_filter = ["source"]
    list_select_related = ["user"]
    search_fields = ["user__username", "subject"]
    exclude = ["refresh_token"]
    readonly_fields = ["given"]

    @admin.display(description="Rights the directory gave")
    def given(self, account):
        return "; ".join(str(grant) for grant in account.user.directory_grants.select_related("project", "tenant"))


class DirectoryAccountInline(admin.StackedInline):
    model = DirectoryAccount
    fields = ["source", "subject", "groups", "groups_read_at", "last_sign_in_at"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


# A person's page shows who they are in the directory and, apart from what was given by hand, what it gave them.
UserAdmin.inlines = [DirectoryAccountInline, DirectoryGrantInline]


@admin.register(ServiceAccount)
class ServiceAccountAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Projects' service accounts (their leads manage them on the team page; their tokens are under API tokens)."""

    list_display = ["user", "project", "description", "created_by", "created_at", "active"]
    list_select_related = ["user", "project__tenant", "created_by"]
    search_fields = ["user__username", "project__slug"]

    @admin.display(boolean=True, ordering="user__is_active")
    def active(self, account):
        return account.user.is_active
