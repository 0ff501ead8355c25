"""Approval policies (configured by operators) and approvals (one per subject awaiting a decision).

The engine is generic: a subject is any model registered with requests.approvals (resource requests,
quota change requests, later sensitive operator actions).
"""

from django.conf import settings
from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from catalog.choices import ServiceKind
from requests.choices import (
    ApprovalMode,
    ApprovalState,
    ApprovalSubject,
    ApproverSource,
    Decision,
    StageState,
)
from tenancy.choices import PriorityClass, Role


class ApprovalPolicy(models.Model):
    name = models.CharField(max_length=120, unique=True)
    subject = models.CharField(max_length=20, choices=ApprovalSubject.choices)
    description = models.TextField(blank=True)
    order = models.PositiveIntegerField(default=100, help_text="Policies are tried in this order.")
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["subject", "order", "name"]
        verbose_name_plural = "approval policies"

    def __str__(self):
        return self.name


class ApprovalRule(models.Model):
    """Conditions (all must hold; empty means any) and, through its stages, who approves."""

    policy = models.ForeignKey(ApprovalPolicy, on_delete=models.CASCADE, related_name="rules")
    order = models.PositiveIntegerField(default=100, help_text="The first matching rule decides the route.")
    name = models.CharField(max_length=120)
    service_kind = models.CharField(max_length=16, choices=ServiceKind.choices, blank=True)
    vendor = models.ForeignKey("catalog.Vendor", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    accelerator_model = models.ForeignKey(
        "catalog.AcceleratorModel", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    spec = models.ForeignKey("catalog.ResourceSpec", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey("tenancy.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("tenancy.Project", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    min_accelerator_count = models.PositiveIntegerField(null=True, blank=True)
    min_cost_estimate = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(0)]
    )
    parameter_name = models.CharField(max_length=60, blank=True, help_text="Order form field, e.g. environment.")
    parameter_value = models.CharField(max_length=200, blank=True)
    quota_exception = models.BooleanField(
        null=True, blank=True, help_text="Yes: only quota exceptions; No: only within quota; empty: any."
    )
    min_priority = models.CharField(
        "priority at least",
        max_length=12,
        choices=PriorityClass.choices,
        blank=True,
        help_text="Only orders of this priority class or a higher one; empty: any.",
    )
    reservation = models.BooleanField(
        null=True,
        blank=True,
        help_text="Yes: only advance reservations (orders for a future window); No: only orders to run now; empty: "
        "any.",
    )
    reserved_within_hours = models.PositiveIntegerField(
        "reserved less than this many hours ahead",
        null=True,
        blank=True,
        help_text="Only reservations whose window starts less than this many hours after the order (short notice); "
        "empty: any lead time.",
    )

    class Meta:
        ordering = ["policy", "order", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(parameter_name="") | ~Q(parameter_value=""), name="rule_parameter_has_value"
            ),
        ]

    def __str__(self):
        return f"{self.policy.name}: {self.name}"


class ApprovalRuleStage(models.Model):
    rule = models.ForeignKey(ApprovalRule, on_delete=models.CASCADE, related_name="stages")
    order = models.PositiveIntegerField(default=1)
    name = models.CharField(max_length=120)
    source = models.CharField(max_length=16, choices=ApproverSource.choices)
    mode = models.CharField(max_length=4, choices=ApprovalMode.choices, default=ApprovalMode.ANY)
    users = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="+", help_text="For source 'named users'."
    )
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+", help_text="For source 'group'."
    )
    project_role = models.CharField(
        max_length=12,
        blank=True,
        choices=[(Role.APPROVER, "Approver"), (Role.LEAD, "Lead")],
        help_text="For source 'project role'.",
    )

    class Meta:
        ordering = ["rule", "order", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(source=ApproverSource.GROUP) | Q(group__isnull=False), name="group_stage_names_group"
            ),
            models.CheckConstraint(
                condition=~Q(source=ApproverSource.PROJECT_ROLE) | ~Q(project_role=""), name="role_stage_names_role"
            ),
        ]

    def __str__(self):
        return f"{self.order}. {self.name}"


class Approval(ConcurrentTransitionMixin, models.Model):
    """The approval of one subject: its resolved stages and approvers, frozen at submission."""

    subject_type = models.ForeignKey(ContentType, on_delete=models.PROTECT, related_name="+")
    subject_id = models.PositiveBigIntegerField("subject ID")
    subject = GenericForeignKey("subject_type", "subject_id")
    project = models.ForeignKey(
        "tenancy.Project",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="approvals",
        help_text="Empty for subjects outside any project.",
    )
    requester = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    rule = models.ForeignKey(ApprovalRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    route_name = models.CharField(max_length=250, help_text="Policy and rule that chose the route.")
    explanation = models.CharField(
        max_length=300, blank=True, help_text="Why it needs approval, in words: what the requester and approvers read."
    )
    summary = models.CharField(max_length=250, help_text="What is being approved, for the inbox.")
    state = FSMField(max_length=12, choices=ApprovalState.choices, default=ApprovalState.PENDING, protected=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["subject_type", "subject_id"], name="one_approval_per_subject"),
        ]
        indexes = [models.Index(fields=["state", "created_at"], name="approval_state_age_idx")]

    def __str__(self):
        return f"Approval of {self.summary}"

    # Transitions change only the state and its time; the approval engine saves and tells the subject.
    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.APPROVED)
    def approve(self, *, at):
        self.decided_at = at

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.REJECTED)
    def reject(self, *, at):
        self.decided_at = at

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.CANCELLED)
    def cancel(self, *, at):
        """The subject went away before anyone decided."""
        self.decided_at = at


class ApprovalStage(ConcurrentTransitionMixin, models.Model):
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="stages")
    order = models.PositiveIntegerField()
    name = models.CharField(max_length=120)
    source = models.CharField(max_length=16, choices=ApproverSource.choices)
    mode = models.CharField(max_length=4, choices=ApprovalMode.choices)
    state = FSMField(max_length=12, choices=StageState.choices, default=StageState.WAITING, protected=True)
    note = models.CharField(max_length=250, blank=True, help_text="How the approvers were found.")
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["approval", "order"]
        constraints = [models.UniqueConstraint(fields=["approval", "order"], name="stage_order_unique")]

    def __str__(self):
        return f"{self.name} ({self.get_state_display()})"

    @transition(field=state, source=StageState.WAITING, target=StageState.PENDING)
    def open(self):
        """The stage before it passed: its approvers may decide now."""

    @transition(field=state, source=StageState.PENDING, target=StageState.APPROVED)
    def approve(self, *, at):
        self.decided_at = at

    @transition(field=state, source=StageState.PENDING, target=StageState.REJECTED)
    def reject(self, *, at):
        self.decided_at = at

    @transition(field=state, source=[StageState.WAITING, StageState.PENDING], target=StageState.CANCELLED)
    def cancel(self):
        """The approval ended (rejected at another stage, or withdrawn) before this stage was decided."""


class ApprovalAssignment(models.Model):
    """One approver's place in one stage, and their decision once made."""

    stage = models.ForeignKey(ApprovalStage, on_delete=models.CASCADE, related_name="assignments")
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_tasks")
    decision = models.CharField(max_length=8, choices=Decision.choices, blank=True)
    comment = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["stage", "approver__username"]
        constraints = [
            models.UniqueConstraint(fields=["stage", "approver"], name="one_assignment_per_approver_and_stage"),
            models.CheckConstraint(condition=Q(decision="") | Q(decided_at__isnull=False), name="decision_has_time"),
        ]

    def __str__(self):
        return f"{self.approver} on {self.stage}"
