"""The approval engine: choose a route, resolve approvers, record decisions, hand the result back.

It is generic over what it approves. A subject model registers a handler (see `register_subject`) that
supplies the facts policies match on and receives the outcome; the engine never imports the subject's app.
A handler may also name who decides when no policy rule matches (`default_route`): such a subject is
governed, and is never approved automatically, not even by a matching rule without stages.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import models, transaction
from django.db.models import Prefetch, Q
from django.utils import timezone

from config.errors import Conflict, DomainError, NotPermitted
from config.prefetch import attach_prefetched
from config.versions import KeptPerProcess
from config.words import listed
from requests.choices import (
    ApprovalMode,
    ApprovalState,
    ApproverSource,
    Decision,
    EventCode,
    StageState,
)
from requests.models import Approval, ApprovalAssignment, ApprovalRule, ApprovalRuleStage, ApprovalStage
from requests.policy_words import conditions_in_words
from tenancy.choices import PRIORITY_RANK
from tenancy.models import Membership, Project, User
from tenancy.operators import OPERATOR_GROUP


@dataclass(frozen=True)
class Facts:
    """What approval rules can look at, taken from the subject when it is submitted."""

    subject: str
    project: Project | None  # None for subjects outside any project (e.g. an operator's isolation clearance)
    requester: User
    summary: str
    service_kind: str = ""
    vendor_ids: frozenset[int] = frozenset()
    accelerator_model_ids: frozenset[int] = frozenset()
    spec_id: int | None = None
    accelerator_count: int = 0
    cost_estimate: Decimal = Decimal(0)
    parameters: dict[str, Any] = field(default_factory=dict)
    quota_exception: bool = False  # over a quota limit or over the project's priority entitlement
    priority: str = ""  # the order's priority class; empty for subjects without one
    reservation: bool = False  # an order for a future window (requests/reservations.py)
    lead_hours: Decimal | None = None  # a reservation's: how long before its start it was ordered


@dataclass(frozen=True)
class DefaultRoute:
    """Who decides a governed subject when no policy rule routes it; the requester is dropped by the engine."""

    name: str
    stage: str
    approvers: list[User]
    source: str = ApproverSource.OPERATORS
    note: str = ""
    reason: str = ""  # why the subject needs it, in words ("it is a quota exception")


class SubjectHandler(Protocol):
    """What a subject app registers. Optionally it also defines `default_route(facts) -> DefaultRoute | None`:
    a route for when no rule matches, which also makes the subject governed (never approved automatically)."""

    subject: str  # the ApprovalSubject value its Facts carry

    def on_approved(self, subject: models.Model, *, actor: User | None) -> None: ...

    def on_rejected(self, subject: models.Model, *, actor: User, comment: str) -> None: ...

    def note(self, subject: models.Model, *, code: str, message: str, actor: User | None, data: dict) -> None: ...


_handlers: dict[type[models.Model], SubjectHandler] = {}
_handlers_by_subject: dict[str, SubjectHandler] = {}


def register_subject(model: type[models.Model], handler: SubjectHandler) -> None:
    _handlers[model] = handler
    # The first model registered for a subject kind owns its default route (e.g. resource requests own it for
    # the extensions of resource requests, which are approved by the same rules).
    _handlers_by_subject.setdefault(handler.subject, handler)


def _handler_for(subject: models.Model) -> SubjectHandler:
    return _handlers[type(subject)]


def default_route(facts: Facts) -> DefaultRoute | None:
    """The subject's own route when no rule decides; None when the subject may be approved automatically."""
    handler = _handlers_by_subject.get(facts.subject)
    provider = getattr(handler, "default_route", None)
    return provider(facts) if provider is not None else None


# --- Routing -----------------------------------------------------------------------------------------------


def rule_matches(rule: ApprovalRule, facts: Facts) -> bool:
    checks = [
        not rule.service_kind or rule.service_kind == facts.service_kind,
        rule.vendor_id is None or rule.vendor_id in facts.vendor_ids,
        rule.accelerator_model_id is None or rule.accelerator_model_id in facts.accelerator_model_ids,
        rule.spec_id is None or rule.spec_id == facts.spec_id,
        rule.tenant_id is None or (facts.project is not None and rule.tenant_id == facts.project.tenant_id),
        rule.project_id is None or (facts.project is not None and rule.project_id == facts.project.pk),
        rule.min_accelerator_count is None or facts.accelerator_count >= rule.min_accelerator_count,
        rule.min_cost_estimate is None or facts.cost_estimate >= rule.min_cost_estimate,
        not rule.parameter_name or str(facts.parameters.get(rule.parameter_name, "")) == rule.parameter_value,
        rule.quota_exception is None or rule.quota_exception == facts.quota_exception,
        not rule.min_priority
        or (facts.priority in PRIORITY_RANK and PRIORITY_RANK[facts.priority] >= PRIORITY_RANK[rule.min_priority]),
        rule.reservation is None or rule.reservation == facts.reservation,
        rule.reserved_within_hours is None
        or (facts.lead_hours is not None and facts.lead_hours < rule.reserved_within_hours),
    ]
    return all(checks)


# What a rule's conditions name, read with it so that its conditions can be put in words.
RULE_CONDITION_ITEMS = ("policy", "vendor", "accelerator_model__vendor", "spec", "tenant", "project__tenant")


def _active_rules() -> dict[str, list[ApprovalRule]]:
    """Every active policy's rules with their stages, per subject, in the order they are tried. The stages' named
    users are not kept: who of them may approve (is still active) is read when a rule matches."""
    rules = (
        ApprovalRule.objects.filter(policy__active=True)
        .select_related(*RULE_CONDITION_ITEMS)
        .prefetch_related(Prefetch("stages", queryset=ApprovalRuleStage.objects.select_related("group")))
        .order_by("policy__order", "policy__name", "order", "id")
    )
    by_subject: dict[str, list[ApprovalRule]] = {}
    for rule in rules:
        rule.reason = listed(conditions_in_words(rule))  # kept with the rule: a route says why in words
        by_subject.setdefault(rule.policy.subject, []).append(rule)
    return by_subject


# Every order is routed by the rules, which operators change rarely: kept per process (config/versions.py).
_kept_rules = KeptPerProcess("approval_policies", _active_rules)


def matching_rule(facts: Facts) -> ApprovalRule | None:
    """The first rule, by policy order then rule order, whose conditions all hold."""
    return next((rule for rule in _kept_rules.get().get(facts.subject, []) if rule_matches(rule, facts)), None)


@dataclass
class ResolvedStage:
    order: int
    name: str
    source: str
    mode: str
    approvers: list[User]
    note: str = ""

    @property
    def who(self) -> str:
        """The approvers by name: "Anna Approver", "any one of A and B", "all of A and B"."""
        names = [user.display_name for user in self.approvers]
        if len(names) == 1:
            return names[0]
        return f"{'all' if self.mode == ApprovalMode.ALL else 'any one'} of {listed(names)}"

    @property
    def in_words(self) -> str:
        return f"{self.name}: {self.who}"


@dataclass
class Route:
    """The stages a subject will pass through; no stages means automatic approval."""

    name: str  # the policy and rule ("Resource requests / Ascend NPUs"): for operators and the API
    rule: ApprovalRule | None
    stages: list[ResolvedStage]
    reason: str = ""  # why this route, in words ("the vendor is Huawei Ascend"); "" when every order takes it

    @property
    def automatic(self) -> bool:
        return not self.stages

    @property
    def explanation(self) -> str:
        """The route as the requester and approvers read it, without policy or rule names."""
        if self.automatic:
            if self.rule is None:
                return "Approved automatically: no approval rule applies to this order."
            return f"Approved automatically, since {self.reason}." if self.reason else "Approved automatically."
        return f"Needs approval, since {self.reason}." if self.reason else "Needs approval."

    def in_words(self) -> str:
        """The explanation and who approves, stage by stage (the timeline's sentence)."""
        stages = "; then ".join(stage.in_words for stage in self.stages)
        return f"{self.explanation} {stages}." if stages else self.explanation

    def as_data(self) -> dict:
        return {
            "name": self.name,
            "explanation": self.explanation,
            "rule": self.rule.pk if self.rule is not None else None,
            "automatic": self.automatic,
            "stages": [
                {
                    "order": stage.order,
                    "name": stage.name,
                    "mode": stage.mode,
                    "source": stage.source,
                    "approvers": [user.username for user in stage.approvers],
                    "approver_names": [user.display_name for user in stage.approvers],
                    "who": stage.who,
                    "note": stage.note,
                }
                for stage in self.stages
            ],
        }


def _active(users: Iterable[User] | models.QuerySet) -> list[User]:
    return sorted({user for user in users if user.is_active}, key=lambda user: user.username)


def operators() -> list[User]:
    return _active(User.objects.filter(Q(groups__name=OPERATOR_GROUP) | Q(is_superuser=True), is_staff=True))


def permission_holders(permission: str) -> list[User]:
    """Active users holding an "app_label.codename" permission directly, through a group, or as superusers."""
    app_label, codename = permission.split(".", 1)
    granted = Q(content_type__app_label=app_label, codename=codename)
    holders = User.objects.filter(
        Q(is_superuser=True)
        | Q(user_permissions__in=Permission.objects.filter(granted))
        | Q(groups__permissions__in=Permission.objects.filter(granted))
    )
    return _active(holders.distinct())


def operators_decide(name: str, *, reason: str = "") -> DefaultRoute:
    """The default route of quota matters: any operator decides."""
    return DefaultRoute(name=name, stage="Operators", approvers=operators(), reason=reason)


def _candidates(stage: ApprovalRuleStage, facts: Facts) -> list[User]:
    match stage.source:
        case ApproverSource.USERS:
            return _active(stage.users.all())
        case ApproverSource.GROUP:
            return _active(stage.group.user_set.all())
        case ApproverSource.PROJECT_ROLE | ApproverSource.TENANT_ADMINS if facts.project is None:
            return []
        case ApproverSource.PROJECT_ROLE:
            holders = Membership.objects.filter(project=facts.project, role=stage.project_role)
            return _active(User.objects.filter(pk__in=holders.values("user_id")))
        case ApproverSource.MANAGER:
            manager = facts.requester.manager
            return _active([manager] if manager else [])
        case ApproverSource.TENANT_ADMINS:
            return _active(facts.project.tenant.admins.all())
        case ApproverSource.OPERATORS:
            return operators()
    raise ValueError(f"Unknown approver source {stage.source!r}")


def _others(users: Iterable[User], facts: Facts) -> list[User]:
    return [user for user in users if user.pk != facts.requester.pk]


def _resolve(stage: ApprovalRuleStage, facts: Facts) -> ResolvedStage:
    """Approvers of one stage, never including the requester; when nobody is left, the subject's default
    approvers stand in (operators for subjects without a default route)."""
    approvers = _others(_candidates(stage, facts), facts)
    note = ""
    if not approvers:
        fallback = default_route(facts)
        approvers = _others(fallback.approvers if fallback else operators(), facts)
        note = (
            f"No eligible approver from '{stage.get_source_display()}'; routed to "
            f"{fallback.stage.lower() if fallback else 'operators'}."
        )
    if not approvers:
        raise DomainError(
            f"Stage '{stage.name}' has no eligible approver and nobody can stand in.",
            code="no_eligible_approver",
            details={"stage": stage.name},
        )
    return ResolvedStage(stage.order, stage.name, stage.source, stage.mode, approvers, note)


def _default_stage(route: DefaultRoute, facts: Facts) -> ResolvedStage:
    approvers = _others(route.approvers, facts)
    if not approvers:
        raise DomainError(
            f"Nobody but the requester can decide '{route.stage}'.",
            code="no_eligible_approver",
            details={"stage": route.stage},
        )
    return ResolvedStage(1, route.stage, route.source, ApprovalMode.ANY, approvers, route.note)


def route_for(facts: Facts) -> Route:
    """Resolve the route now, without storing anything (used by preview and by submission)."""
    rule = matching_rule(facts)
    if rule is not None:
        stages = [_resolve(stage, facts) for stage in rule.stages.all()]
        if stages:
            return Route(name=f"{rule.policy.name} / {rule.name}", rule=rule, stages=stages, reason=rule.reason)
    # Governance floor: a subject with a default route (quota changes and exceptions, isolation clearances)
    # is never approved automatically, not even by a matching rule without stages.
    fallback = default_route(facts)
    if fallback is not None:
        return Route(name=fallback.name, rule=None, stages=[_default_stage(fallback, facts)], reason=fallback.reason)
    if rule is not None:
        return Route(name=f"{rule.policy.name} / {rule.name}", rule=rule, stages=[], reason=rule.reason)
    return Route(name="No matching rule: automatic approval", rule=None, stages=[])


# --- Lifecycle ---------------------------------------------------------------------------------------------


def approval_start(*, subject: models.Model, facts: Facts) -> tuple[Approval | None, Route]:
    """Resolve and store the approval of a subject; (None, route) when the route is automatic."""
    route = route_for(facts)
    if route.automatic:
        return None, route
    return approval_open(subject=subject, facts=facts, route=route), route


@transaction.atomic(savepoint=False)  # all or nothing, without a savepoint of its own inside the caller's transaction
def approval_open(*, subject: models.Model, facts: Facts, route: Route) -> Approval:
    """Store the approval of a subject on a resolved route with stages: the approval, its stages and their
    assignments in one INSERT each, attached to one another so that showing the new approval reads nothing."""
    approval = Approval.objects.create(
        subject_type=ContentType.objects.get_for_model(subject),
        subject_id=subject.pk,
        project=facts.project,
        requester=facts.requester,
        rule=route.rule,
        route_name=route.name[:250],
        explanation=route.explanation[:300],
        summary=facts.summary[:250],
    )
    stages = ApprovalStage.objects.bulk_create(
        ApprovalStage(
            approval=approval,
            order=position + 1,
            name=resolved.name,
            source=resolved.source,
            mode=resolved.mode,
            note=resolved.note,
            state=StageState.PENDING if position == 0 else StageState.WAITING,
        )
        for position, resolved in enumerate(route.stages)
    )
    assignments = ApprovalAssignment.objects.bulk_create(
        ApprovalAssignment(stage=stage, approver=user)
        for stage, resolved in zip(stages, route.stages, strict=True)
        for user in resolved.approvers
    )
    for stage in stages:
        attach_prefetched(stage, "assignments", [task for task in assignments if task.stage is stage])
    attach_prefetched(approval, "stages", stages)
    return approval


def approval_for(subject: models.Model, *, lock: bool = False) -> Approval | None:
    approvals = Approval.objects.select_for_update() if lock else Approval.objects
    return approvals.filter(subject_type=ContentType.objects.get_for_model(subject), subject_id=subject.pk).first()


@transaction.atomic
def approval_decide(*, assignment: ApprovalAssignment, decision: str, comment: str, actor: User) -> Approval:
    """Record one approver's decision and move the approval on; the subject hears the final outcome."""
    assignment = ApprovalAssignment.objects.select_for_update().select_related("stage__approval").get(pk=assignment.pk)
    stage = assignment.stage
    approval = Approval.objects.select_for_update().get(pk=stage.approval_id)
    _check_can_decide(assignment, approval, decision, comment, actor)
    now = timezone.now()
    assignment.decision, assignment.comment, assignment.decided_at = decision, comment.strip(), now
    assignment.save(update_fields=["decision", "comment", "decided_at"])
    subject = approval.subject
    handler = _handler_for(subject)
    if decision == Decision.REJECT:
        approval.reject(at=now)
        approval.save(update_fields=["state", "decided_at"])
        _close_open_stages(approval, rejected=stage, now=now)
        handler.on_rejected(subject, actor=actor, comment=assignment.comment)
        return approval
    if not _stage_complete(stage):
        handler.note(
            subject,
            code=EventCode.STAGE_VOTE,
            actor=actor,
            data={"stage": stage.name},
            message=f"{actor.display_name} approved; '{stage.name}' needs every approver.",
        )
        return approval
    stage.approve(at=now)
    stage.save(update_fields=["state", "decided_at"])
    following = approval.stages.filter(order__gt=stage.order).order_by("order").first()
    if following is not None:
        following.open()
        following.save(update_fields=["state"])
        handler.note(
            subject,
            code=EventCode.STAGE_APPROVED,
            actor=actor,
            data={"stage": stage.name, "next": following.name},
            message=f"'{stage.name}' approved by {actor.display_name}; next: '{following.name}'.",
        )
        return approval
    approval.approve(at=now)
    approval.save(update_fields=["state", "decided_at"])
    handler.on_approved(subject, actor=actor)
    return approval


def approvals_bulk_approve(*, task_ids: list[int], comment: str, actor: User) -> list[dict]:
    """Approve each of the actor's tasks on its own (own transaction); one refusal does not stop the others."""
    return approvals_bulk_decide(task_ids=task_ids, decision=Decision.APPROVE, comment=comment, actor=actor)


def approvals_bulk_decide(*, task_ids: list[int], decision: str, comment: str, actor: User) -> list[dict]:
    """Decide each of the actor's tasks on its own through `approval_decide` (own transaction each); one refusal
    does not stop the others. One result per task: {id, ok, code, message}."""
    tasks = ApprovalAssignment.objects.filter(approver=actor).in_bulk(task_ids)
    results = []
    for pk in dict.fromkeys(task_ids):
        try:
            if pk not in tasks:
                raise DomainError("No such approval task.", code="not_found")
            approval_decide(assignment=tasks[pk], decision=decision, comment=comment, actor=actor)
        except DomainError as refusal:
            results.append({"id": pk, "ok": False, "code": refusal.code, "message": refusal.message})
        else:
            results.append({"id": pk, "ok": True, "code": None, "message": None})
    return results


def _check_can_decide(assignment, approval, decision, comment, actor) -> None:
    if decision not in Decision.values:
        raise DomainError(f"Decision must be one of {', '.join(Decision.values)}.", code="invalid_decision")
    if actor.pk == approval.requester_id:
        raise NotPermitted("You cannot approve or reject your own request.", code="self_approval")
    if assignment.approver_id != actor.pk:
        raise NotPermitted("This approval task belongs to someone else.", code="not_your_approval")
    if assignment.decision:
        raise Conflict(
            "You have already decided on this stage.", code="already_decided", details={"decision": assignment.decision}
        )
    if approval.state != ApprovalState.PENDING or assignment.stage.state != StageState.PENDING:
        raise Conflict(
            "This approval is not waiting for this stage's decision.",
            code="approval_not_pending",
            details={"approval_state": approval.state, "stage_state": assignment.stage.state},
        )
    if decision == Decision.REJECT and not comment.strip():
        raise DomainError("Say why you reject it; the requester sees your comment.", code="comment_required")


def _stage_complete(stage: ApprovalStage) -> bool:
    decisions = list(stage.assignments.values_list("decision", flat=True))
    if stage.mode == ApprovalMode.ANY:
        return Decision.APPROVE in decisions
    return all(decision == Decision.APPROVE for decision in decisions)


def _close_open_stages(approval: Approval, *, rejected: ApprovalStage | None, now) -> None:
    """The approval has ended: the stage that rejected it records that, every other open stage is cancelled."""
    open_stages = approval.stages.select_for_update().filter(state__in=[StageState.PENDING, StageState.WAITING])
    for stage in open_stages:
        if rejected is not None and stage.pk == rejected.pk:
            stage.reject(at=now)
        else:
            stage.cancel()
        stage.save(update_fields=["state", "decided_at"])


@transaction.atomic
def approval_cancel(*, subject: models.Model) -> None:
    """Withdraw a pending approval because its subject went away (cancelled by the requester)."""
    approval = approval_for(subject, lock=True)
    if approval is not None and approval.state == ApprovalState.PENDING:
        now = timezone.now()
        approval.cancel(at=now)
        approval.save(update_fields=["state", "decided_at"])
        _close_open_stages(approval, rejected=None, now=now)


def _stage_candidates(stage: ApprovalStage, facts: Facts) -> list[User]:
    """Who may decide this stage by the rules now: the rule stage it was resolved from, else the subject's default
    route, and when nobody is eligible, who stands in (as at routing, `_resolve`)."""
    approval = stage.approval
    # A routed approval's stages are the rule's stages in their order, numbered from 1 (`approval_open`).
    rule_stages = list(approval.rule.stages.all()) if approval.rule_id else []
    rule_stage = rule_stages[stage.order - 1] if stage.order <= len(rule_stages) else None
    if rule_stage is not None:
        try:
            return _resolve(rule_stage, facts).approvers
        except DomainError:
            return []
    fallback = default_route(facts)
    return _others(fallback.approvers if fallback else operators(), facts)


@transaction.atomic
def approvals_reroute_from(*, user: User) -> int:
    """The person lost rights (tenancy's `directory_rights_removed`): each open stage waiting on their decision is
    routed again by the approval rules. Their task goes when the rules no longer name them, and whoever the rules
    name now and is not yet on the stage is added; the subject's timeline says so. How many tasks were re-routed."""
    waiting = (
        ApprovalAssignment.objects.select_for_update(of=("self",))
        .filter(
            approver=user,
            decision="",
            stage__state__in=[StageState.PENDING, StageState.WAITING],
            stage__approval__state=ApprovalState.PENDING,
        )
        .select_related("stage__approval__project__tenant", "stage__approval__requester", "stage__approval__rule")
    )
    rerouted = 0
    for assignment in waiting:
        stage, approval = assignment.stage, assignment.stage.approval
        handler = _handler_for(approval.subject)
        facts = Facts(
            subject=handler.subject, project=approval.project, requester=approval.requester, summary=approval.summary
        )
        candidates = _stage_candidates(stage, facts)
        if any(candidate.pk == user.pk for candidate in candidates):
            continue
        assignment.delete()
        present = set(stage.assignments.values_list("approver_id", flat=True))
        added = [candidate for candidate in candidates if candidate.pk not in present]
        ApprovalAssignment.objects.bulk_create(ApprovalAssignment(stage=stage, approver=who) for who in added)
        handler.note(
            approval.subject,
            code=EventCode.ROUTED,
            actor=None,
            data={"stage": stage.name, "removed": user.username, "added": [who.username for who in added]},
            message=f"{user.username} may no longer decide '{stage.name}'; routed again"
            + (f" to {', '.join(who.username for who in added)}." if added else " to the approvers already on it."),
        )
        rerouted += 1
    return rerouted


def approvals_remind_stale(*, older_than) -> int:
    """Note a reminder on every pending approval not decided (or reminded) within the SLA."""
    cutoff = timezone.now() - older_than
    stale = Approval.objects.filter(state=ApprovalState.PENDING, created_at__lt=cutoff).filter(
        Q(reminded_at__isnull=True) | Q(reminded_at__lt=cutoff)
    )
    reminded = 0
    for approval in stale.prefetch_related("stages__assignments__approver"):
        with transaction.atomic():
            waiting_on = [
                assignment.approver
                for stage in approval.stages.all()
                if stage.state == StageState.PENDING
                for assignment in stage.assignments.all()
                if not assignment.decision
            ]
            _handler_for(approval.subject).note(
                approval.subject,
                code=EventCode.REMINDER,
                actor=None,
                data={"waiting_on": [user.username for user in waiting_on]},
                message=f"Approval pending since {approval.created_at:%Y-%m-%d %H:%M} UTC; waiting on "
                f"{listed([user.display_name for user in waiting_on]) or 'nobody'}.",
            )
            Approval.objects.filter(pk=approval.pk).update(reminded_at=timezone.now())
            reminded += 1
    return reminded
