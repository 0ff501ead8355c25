"""Demo approval policies: production and large orders need more eyes; quota changes go to operators."""

from catalog.choices import ServiceKind
from catalog.models import ResourceSpec, Vendor
from requests.choices import ApprovalMode, ApprovalSubject, ApproverSource
from requests.models import ApprovalPolicy, ApprovalRule, ApprovalRuleStage
from tenancy.choices import Role

# rule name, conditions, [(stage name, source, mode, project role)]; a rule without stages approves itself.
RESOURCE_RULES = [
    # Above the project's priority entitlement (critical always: no demo project is entitled to it), the project
    # lead and then the operators agree.
    (
        "High-priority exceptions",
        {"min_priority": "high", "quota_exception": True},
        [
            ("Project lead", ApproverSource.PROJECT_ROLE, ApprovalMode.ANY, Role.LEAD),
            ("Operators", ApproverSource.OPERATORS, ApprovalMode.ANY, ""),
        ],
    ),
    (
        "Production environment",
        {"parameter_name": "environment", "parameter_value": "production"},
        [
            ("Project approver", ApproverSource.PROJECT_ROLE, ApprovalMode.ANY, Role.APPROVER),
            ("Requester's manager", ApproverSource.MANAGER, ApprovalMode.ANY, ""),
        ],
    ),
    (
        "Bare-metal servers",
        {"service_kind": ServiceKind.BARE_METAL},
        [
            ("Project lead", ApproverSource.PROJECT_ROLE, ApprovalMode.ANY, Role.LEAD),
            ("Operators", ApproverSource.OPERATORS, ApprovalMode.ANY, ""),
        ],
    ),
    (
        "Eight or more accelerators",
        {"min_accelerator_count": 8},
        [
            ("Project approver", ApproverSource.PROJECT_ROLE, ApprovalMode.ANY, Role.APPROVER),
            ("Operators", ApproverSource.OPERATORS, ApprovalMode.ANY, ""),
        ],
    ),
    (
        "Ascend NPUs",
        {"vendor_slug": "huawei-ascend"},
        [
            ("Tenant administrators", ApproverSource.TENANT_ADMINS, ApprovalMode.ANY, ""),
        ],
    ),
    ("Small MIG slices are self-service", {"spec_slug": "h100-mig-1g", "quota_exception": False}, []),
    (
        "Everything else",
        {},
        [
            ("Project approver", ApproverSource.PROJECT_ROLE, ApprovalMode.ANY, Role.APPROVER),
        ],
    ),
]


def _policy(name: str, subject: str, description: str, rules: list) -> None:
    policy, _ = ApprovalPolicy.objects.update_or_create(
        name=name, defaults={"subject": subject, "description": description, "order": 10}
    )
    for position, (rule_name, conditions, stages) in enumerate(rules, start=1):
        conditions = dict(conditions)
        if vendor_slug := conditions.pop("vendor_slug", None):
            conditions["vendor"] = Vendor.objects.get(slug=vendor_slug)
        if spec_slug := conditions.pop("spec_slug", None):
            conditions["spec"] = ResourceSpec.objects.get(slug=spec_slug)
        rule, _ = ApprovalRule.objects.update_or_create(
            policy=policy, name=rule_name, defaults={"order": position * 10, **conditions}
        )
        for order, (stage_name, source, mode, role) in enumerate(stages, start=1):
            ApprovalRuleStage.objects.update_or_create(
                rule=rule,
                order=order,
                defaults={"name": stage_name, "source": source, "mode": mode, "project_role": role},
            )


def seed(context: dict) -> None:
    _policy(
        "Resource requests",
        ApprovalSubject.RESOURCE_REQUEST,
        "High-priority exceptions, production, bare metal, big orders and NPUs get extra approvers; the rest "
        "needs the project approver.",
        RESOURCE_RULES,
    )
    _policy(
        "Quota changes",
        ApprovalSubject.QUOTA_CHANGE,
        "Operators decide every quota change.",
        [("All quota changes", {}, [("Operators", ApproverSource.OPERATORS, ApprovalMode.ANY, "")])],
    )
    tenant = context["tenants"]["acme-research"]
    tenant.admins.add(context["users"]["lead"])
