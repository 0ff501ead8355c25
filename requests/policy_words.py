"""Approval rules and stages as sentences, for the console's policy pages ("When the service is Compute and at least
4 accelerators: 1. Team approval — any one project approver; then 2. Operators — every operator")."""

from django.conf import settings

from requests.choices import ApprovalMode, ApproverSource
from requests.models import ApprovalRule, ApprovalRuleStage


def conditions_in_words(rule: ApprovalRule) -> list[str]:
    """Each condition the rule sets, in words; an empty list means the rule matches every order."""
    words = []
    if rule.service_kind:
        words.append(f"the service is {rule.get_service_kind_display()}")
    if rule.vendor_id:
        words.append(f"the vendor is {rule.vendor.name}")
    if rule.accelerator_model_id:
        words.append(f"the accelerator is {rule.accelerator_model.name}")
    if rule.spec_id:
        words.append(f"the spec is {rule.spec}")
    if rule.tenant_id:
        words.append(f"the tenant is {rule.tenant}")
    if rule.project_id:
        words.append(f"the project is {rule.project}")
    if rule.min_accelerator_count is not None:
        words.append(
            f"at least {rule.min_accelerator_count} accelerator{'s' if rule.min_accelerator_count != 1 else ''}"
        )
    if rule.min_cost_estimate is not None:
        words.append(f"the estimated cost is at least {rule.min_cost_estimate:.2f} {settings.CATALOG_CURRENCY}")
    if rule.parameter_name:
        words.append(f"the {rule.parameter_name.replace('_', ' ')} is {rule.parameter_value}")
    if rule.quota_exception is True:
        words.append("it is a quota exception")
    elif rule.quota_exception is False:
        words.append("it is within quota")
    if rule.min_priority:
        words.append(f"the priority is {rule.get_min_priority_display().lower()} or higher")
    if rule.reservation is True:
        words.append("it is an advance reservation")
    elif rule.reservation is False:
        words.append("it is not a reservation")
    if rule.reserved_within_hours is not None:
        words.append(f"its window starts within {rule.reserved_within_hours} h of the order")
    return words


def _who(stage: ApprovalRuleStage) -> str:
    every = stage.mode == ApprovalMode.ALL
    match stage.source:
        case ApproverSource.USERS:
            names = ", ".join(user.display_name for user in stage.users.all()) or "nobody named yet"
            return f"{'all of' if every else 'one of'} {names}"
        case ApproverSource.GROUP:
            return f"{'every member' if every else 'any member'} of group {stage.group.name if stage.group else '?'}"
        case ApproverSource.PROJECT_ROLE:
            role = "lead" if stage.project_role == "lead" else "approver"
            return f"{'every' if every else 'any one'} project {role}"
        case ApproverSource.MANAGER:
            return "the requester's manager"
        case ApproverSource.TENANT_ADMINS:
            return f"{'every' if every else 'any one'} tenant administrator"
        case ApproverSource.OPERATORS:
            return f"{'every' if every else 'any one'} operator"
    return stage.get_source_display()


def stage_in_words(stage: ApprovalRuleStage) -> str:
    return f"{stage.order}. {stage.name} — {_who(stage)}"


def rule_in_words(rule: ApprovalRule) -> str:
    """The whole rule as one sentence: when it matches, and who approves, stage by stage."""
    conditions = conditions_in_words(rule)
    when = f"When {' and '.join(conditions)}" if conditions else "Every order"
    stages = [stage_in_words(stage) for stage in rule.stages.all()]
    then = "; then ".join(stages) if stages else "approved automatically"
    return f"{when}: {then}."
