from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.contrib.contenttypes.models import ContentType
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django_fsm import FSMField, transition

from tenancy.choices import (
    DeviceAuthorizationState,
    DirectorySource,
    GroupGrant,
    OrderCap,
    PriorityClass,
    ProjectPermission,
    QuotaDimension,
    Role,
    TokenScope,
)

slug_validator = RegexValidator(r"^[a-z0-9]+(?:-[a-z0-9]+)*$", "Use lowercase letters, digits and single hyphens.")


class User(AbstractUser):
    manager = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="reports",
        help_text="Line manager; approval routing can send requests to them.",
    )

    @property
    def display_name(self) -> str:
        """How pages, mails and the timeline name the person: the full name, else the username."""
        return self.get_full_name() or self.username

    class Meta(AbstractUser.Meta):
        swappable = "AUTH_USER_MODEL"
        constraints = [
            models.CheckConstraint(condition=~Q(manager=models.F("id")), name="user_not_own_manager"),
        ]


class Tenant(models.Model):
    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    admins = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="administered_tenants",
        help_text="Tenant administrators; approval stages can route to them.",
    )
    people = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="tenants",
        help_text="People of the tenant besides its projects' members (directory groups add them): the tenant's "
        "leads add them to projects directly.",
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Project(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=60, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    lead = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="led_projects",
        help_text="Accountable person; always holds the lead role on the project.",
    )
    cost_centre = models.CharField(max_length=40, help_text="Finance cost centre charged for usage.")
    active = models.BooleanField(default=True, help_text="Inactive projects accept no new requests.")
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", through_fields=("project", "user"), related_name="projects"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="project_name_unique_in_tenant")]
        permissions = [(perm.value, perm.label) for perm in ProjectPermission if perm != ProjectPermission.VIEW]

    def __str__(self):
        return f"{self.tenant.name} / {self.name}"


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="one_membership_per_user_and_project"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self):
        return f"{self.user} is {self.get_role_display().lower()} of {self.project.slug}"


def _order_cap_field(cap: OrderCap):
    return models.PositiveIntegerField(
        cap.label,
        null=True,
        blank=True,
        help_text=f"Empty: the platform's default ({cap.setting}); 0: no cap.",
    )


def _limit_field(decimal: bool, help_text: str, label: str):
    """One quota dimension: empty means no limit on that dimension."""
    common = {"verbose_name": label, "null": True, "blank": True, "help_text": f"{help_text} Empty means unlimited."}
    if decimal:
        return models.DecimalField(
            max_digits=12, decimal_places=2, validators=[MinValueValidator(Decimal(0))], **common
        )
    return models.PositiveIntegerField(**common)


class QuotaLimits(models.Model):
    gpus = _limit_field(True, "Whole-card equivalents; a slice counts as its fraction of a card.", "GPUs")
    accelerator_memory_gb = _limit_field(False, "Accelerator memory in GiB.", "accelerator memory (GiB)")
    cpu_cores = _limit_field(False, "CPU cores.", "CPU cores")
    memory_gb = _limit_field(False, "Host memory in GiB.", "memory (GiB)")
    concurrent_tasks = _limit_field(False, "Requests holding resources at the same time.", "concurrent tasks")
    monthly_card_hours = _limit_field(True, "Accelerator card-hours per calendar month.", "card-hours per month")
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        abstract = True

    def limits(self) -> dict[str, Decimal | int | None]:
        return {dimension: getattr(self, dimension) for dimension in QuotaDimension.values}


class ProjectQuota(QuotaLimits):
    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="quota")
    max_priority = models.CharField(
        "priority entitlement",
        max_length=12,
        choices=PriorityClass.choices,
        default=PriorityClass.STANDARD,
        help_text="Highest priority class the project may order without approval; a higher one is refused, or "
        "routed to approval as an exception when the requester asks for one.",
    )
    max_open_per_requester = _order_cap_field(OrderCap.OPEN_PER_REQUESTER)
    max_open_per_project = _order_cap_field(OrderCap.OPEN_PER_PROJECT)
    max_waiting_per_requester = _order_cap_field(OrderCap.WAITING_PER_REQUESTER)
    max_waiting_per_project = _order_cap_field(OrderCap.WAITING_PER_PROJECT)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(max_priority__in=PriorityClass.values), name="project_quota_max_priority_valid"
            ),
            models.CheckConstraint(condition=Q(gpus__gte=0), name="project_quota_gpus_non_negative"),
            models.CheckConstraint(
                condition=Q(monthly_card_hours__gte=0), name="project_quota_card_hours_non_negative"
            ),
        ]

    def __str__(self):
        return f"Quota of {self.project}"


class TenantQuota(QuotaLimits):
    """Optional cap on the sum of all the tenant's projects."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=0), name="tenant_quota_gpus_non_negative"),
            models.CheckConstraint(condition=Q(monthly_card_hours__gte=0), name="tenant_quota_card_hours_non_negative"),
        ]

    def __str__(self):
        return f"Quota of {self.tenant}"


class AuditEvent(models.Model):
    """Append-only record of an administrative change (membership, quota, catalog lifecycle)."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=60, db_index=True)
    # No target for what concerns no stored object, e.g. a failed sign-in with an unknown username.
    target_type = models.ForeignKey(ContentType, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    target_id = models.CharField("target ID", max_length=64, blank=True)
    target_repr = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target_idx")]

    def __str__(self):
        return f"{self.action} on {self.target_repr}"


class MonthlyUsage(models.Model):
    """The quota ledger: card-hours metered per project and calendar month (metering keeps it current).

    Admission reads it for the monthly card-hours dimension, so the request workflow never imports metering and
    counts the same whichever apps are installed: the month's metered card-hours, plus the committed demand of
    the project's requests less what running ones have metered already (`running_card_hours`).
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="monthly_usage")
    month = models.DateField(help_text="First day of the month.")
    card_hours = models.DecimalField(max_digits=14, decimal_places=4, default=Decimal(0))
    running_card_hours = models.DecimalField(
        max_digits=14,
        decimal_places=4,
        default=Decimal(0),
        help_text="What the project's requests still running have metered so far, each up to its own card-hours "
        "(current month only): the part of their demand already in card_hours.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-month", "project"]
        constraints = [
            models.UniqueConstraint(fields=["project", "month"], name="one_usage_row_per_project_month"),
            models.CheckConstraint(condition=Q(month__day=1), name="usage_month_is_first_day"),
            models.CheckConstraint(condition=Q(card_hours__gte=0), name="usage_card_hours_non_negative"),
            models.CheckConstraint(condition=Q(running_card_hours__gte=0), name="usage_running_hours_non_negative"),
        ]

    def __str__(self):
        return f"{self.project.slug} {self.month:%Y-%m}: {self.card_hours} card-hours"


class Invitation(models.Model):
    """A lead's invitation for someone outside the project's tenant: a mail with a one-time link with which they join,
    signed in with the account they have or by creating one. Only the secret's hash is stored; sending again replaces
    the link."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    token_prefix = models.CharField(max_length=12, blank=True, db_index=True)
    token_hash = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(role__in=[Role.MEMBER, Role.APPROVER]), name="invitation_role_valid"),
            models.UniqueConstraint(
                fields=["project", "email"],
                condition=Q(accepted_at__isnull=True, revoked_at__isnull=True),
                name="one_open_invitation_per_project_and_email",
            ),
        ]

    def __str__(self):
        return f"Invitation of {self.email} to {self.project.slug}"

    @property
    def is_open(self) -> bool:
        return self.accepted_at is None and self.revoked_at is None


class ApiToken(models.Model):
    """A person's credential for the API (`Authorization: Token <secret>`), the one token mechanism of the platform:
    issued by signing in at /api/v1/auth/token/, on a person's API tokens page or for a service account,
    shown once, stored as a SHA-256 hash found by its public prefix (config.tokens), expiring, revocable, audited.

    Tokens from before hashing (DRF's 40-hex keys) were hashed by migration; their prefix is the key's first 12
    characters. See docs/security.md for how scopes and service accounts extend this model."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=80, help_text="What uses it, e.g. a laptop's CLI or a CI pipeline.")
    prefix = models.CharField(max_length=12, unique=True, help_text="Public part of the token, to tell tokens apart.")
    hashed = models.CharField(max_length=64)
    scopes = models.JSONField(default=list, help_text="What the token may do (tenancy.choices.TokenScope).")
    project = models.ForeignKey(
        Project,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_tokens",
        help_text="The project a service account's token is bound to; empty for a person's token.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_from = models.GenericIPAddressField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "-created_at"], name="api_token_user_idx")]

    def __str__(self):
        return f"{self.name} ({self.prefix}…) of {self.user}"

    @property
    def scope_labels(self) -> list[str]:
        return [TokenScope(scope).label for scope in self.scopes if scope in TokenScope.values]


class DeviceAuthorization(models.Model):
    """One device sign-in (OAuth 2.0 device authorization grant, RFC 8628) by which `cc login` gets a personal API
    token from a server with company sign-in: the CLI holds the device code and polls; the person, signed in on the
    portal however the server signs people in, types the user code on /device/ and approves or denies what is asked;
    the CLI's next poll gets the token, once. Both codes are stored only as SHA-256 hashes (tenancy/device_flow.py)."""

    device_code_hash = models.CharField(max_length=64, unique=True)
    user_code_hash = models.CharField(max_length=64, unique=True)
    token_name = models.CharField(max_length=80, help_text="The name the issued token gets, e.g. cc on a laptop.")
    scopes = models.JSONField(default=list, help_text="The scopes the issued token gets (TokenScope).")
    token_days = models.PositiveIntegerField(help_text="How many days the issued token lives.")
    requested_from = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True, help_text="The codes work until then.")
    interval_seconds = models.PositiveSmallIntegerField(help_text="The least wait between polls; slow_down adds to it.")
    last_polled_at = models.DateTimeField(null=True, blank=True)
    state = FSMField(
        max_length=10,
        choices=DeviceAuthorizationState.choices,
        default=DeviceAuthorizationState.PENDING,
        protected=True,
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"Device sign-in {self.token_name} ({self.get_state_display()})"

    # Transitions change the state and what goes with it; tenancy.device_flow locks and saves.
    @transition(field=state, source=DeviceAuthorizationState.PENDING, target=DeviceAuthorizationState.APPROVED)
    def approve(self, *, by, at) -> None:
        self.decided_by, self.decided_at = by, at

    @transition(field=state, source=DeviceAuthorizationState.PENDING, target=DeviceAuthorizationState.DENIED)
    def deny(self, *, by, at) -> None:
        self.decided_by, self.decided_at = by, at

    @transition(field=state, source=DeviceAuthorizationState.APPROVED, target=DeviceAuthorizationState.USED)
    def use(self, *, token: ApiToken) -> None:
        self.token = token


class ServiceAccount(models.Model):
    """A non-person account of a project for CI pipelines and other machines: a user without a password (it never
    signs in), a member of its project only, acting through scoped API tokens its project's lead issues."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="service_account"
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="service_accounts")
    description = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "user__username"]

    def __str__(self):
        return f"Service account {self.user.username} of {self.project.slug}"


class DirectoryAccount(models.Model):
    """Who a person is in the company directory and which of its groups they were last seen in: read at each
    sign-in (the OIDC group claim, or LDAP's group search) and by the periodic sync (tenancy.directory.sync)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="directory_account"
    )
    source = models.CharField(max_length=8, choices=DirectorySource.choices)
    subject = models.CharField(
        max_length=255, help_text="The IdP's `sub` claim, or the LDAP entry's distinguished name."
    )
    groups = models.JSONField(default=list, blank=True, help_text="Group names (and DNs) as last read.")
    groups_read_at = models.DateTimeField(null=True, blank=True)
    # OIDC only: the refresh token with which the sync asks the IdP for current claims; encrypted with a key derived
    # from SECRET_KEY (tenancy.directory.secrets), never shown.
    refresh_token = models.TextField(blank=True, editable=False)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "subject"], name="one_account_per_directory_subject"),
            models.CheckConstraint(condition=Q(source__in=DirectorySource.values), name="directory_source_valid"),
        ]

    def __str__(self):
        return f"{self.user} in {self.get_source_display()}"


class GroupMapping(models.Model):
    """An operator's rule: people in directory group `group` get `grant` (on `tenant` or `project`). Applied at every
    sign-in and by the periodic sync; taking someone out of the group takes the right away again."""

    group = models.CharField(
        max_length=255,
        help_text="The group's name as the IdP's group claim gives it, or its LDAP common name or DN (any case).",
    )
    grant = models.CharField(max_length=20, choices=GroupGrant.choices)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="group_mappings")
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="group_mappings")
    active = models.BooleanField(default=True)
    note = models.CharField(max_length=200, blank=True)
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who last wrote the rule; an operator rule applies only while they are an operator.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["group", "grant", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(grant__in=GroupGrant.values), name="group_mapping_grant_valid"),
            models.CheckConstraint(
                condition=(
                    Q(grant__in=[GroupGrant.TENANT_MEMBER, GroupGrant.TENANT_ADMIN], tenant__isnull=False)
                    & Q(project__isnull=True)
                )
                | (
                    Q(
                        grant__in=[GroupGrant.PROJECT_MEMBER, GroupGrant.PROJECT_APPROVER, GroupGrant.PROJECT_LEAD],
                        project__isnull=False,
                    )
                    & Q(tenant__isnull=True)
                )
                | Q(grant=GroupGrant.OPERATOR, tenant__isnull=True, project__isnull=True),
                name="group_mapping_target_fits_grant",
                violation_error_message="Tenant grants name a tenant, project grants a project, the operator grant "
                "neither.",
            ),
        ]

    def __str__(self):
        target = self.project or self.tenant
        return f"{self.group} → {self.get_grant_display()}" + (f" of {target}" if target else "")


class DirectoryGrant(models.Model):
    """A right the directory gave a person (the sync created it): kept while some active mapping of one of their
    groups still gives it, taken away when none does. A right the person already had is manual and never one of
    these, so the directory never takes away what a lead or an operator granted by hand."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="directory_grants")
    grant = models.CharField(max_length=20, choices=GroupGrant.choices)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    groups = models.JSONField(default=list, help_text="The groups whose mappings give it, as last applied.")
    granted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "grant"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "grant", "project"],
                condition=Q(project__isnull=False),
                name="one_directory_grant_per_project_right",
            ),
            models.UniqueConstraint(
                fields=["user", "grant", "tenant"],
                condition=Q(tenant__isnull=False),
                name="one_directory_grant_per_tenant_right",
            ),
            models.UniqueConstraint(
                fields=["user"], condition=Q(grant="operator"), name="one_directory_operator_grant_per_user"
            ),
        ]

    def __str__(self):
        target = self.project or self.tenant
        return f"{self.user}: {self.get_grant_display()}" + (f" of {target}" if target else "")


class SshKey(models.Model):
    """A named SSH public key on a person's profile: every container workspace they order starts with all of them in
    its authorized_keys, so an order needs no key pasted. Checked when added (config.ssh_keys)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=80, help_text="Which machine holds the private key, e.g. work laptop.")
    public_key = models.TextField(help_text="The OpenSSH public key line: type, base64 key, comment.")
    fingerprint = models.CharField(max_length=60, help_text="SHA256:..., as ssh-keygen -l prints it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "SSH key"
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="one_ssh_key_name_per_user"),
            models.UniqueConstraint(fields=["user", "fingerprint"], name="one_ssh_key_per_user"),
        ]

    def __str__(self):
        return f"{self.name} ({self.fingerprint}) of {self.user}"

    @property
    def key_type(self) -> str:
        return self.public_key.split(" ", 1)[0]
