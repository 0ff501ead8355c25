"""Demo people and organisation: users with a manager, two tenants, three projects with quotas and members.

Every app may have a `demo` module with `seed(context)`; `manage.py seed_demo` runs them in INSTALLED_APPS
order, so lower apps create what higher apps' demo data refers to. Each seed is idempotent.
"""

from decimal import Decimal

from tenancy import services
from tenancy.choices import GroupGrant, PriorityClass, Role
from tenancy.models import GroupMapping, Project, Tenant, User
from tenancy.operators import sync_operator_group

D = Decimal
DEMO_PASSWORD_DEFAULT = "catalog-demo-2026"


def _user(username: str, password: str, *, first: str, last: str, staff=False, superuser=False) -> User:
    user, created = User.objects.get_or_create(
        username=username,
        defaults={
            "first_name": first,
            "last_name": last,
            "email": f"{username}@example.com",
            "is_staff": staff or superuser,
            "is_superuser": superuser,
        },
    )
    if created or not user.check_password(password):
        user.set_password(password)
        user.save(update_fields=["password"])
    return user


def seed_people(password: str) -> dict[str, User]:
    users = {
        "admin": _user("admin", password, first="Ada", last="Admin", superuser=True),
        "operator": _user("operator", password, first="Oscar", last="Operator", staff=True),
        "lead": _user("lead", password, first="Lena", last="Lead"),
        "approver": _user("approver", password, first="Arjun", last="Approver"),
        "developer": _user("developer", password, first="Dana", last="Developer"),
        "developer2": _user("developer2", password, first="Dmitri", last="Developer"),
    }
    users["operator"].groups.add(sync_operator_group())
    for report in ("developer", "developer2", "approver"):
        if users[report].manager_id != users["lead"].pk:
            services.user_set_manager(user=users[report], manager=users["lead"], actor=None)
    return users


# tenant slug, name, cap, [(project slug, name, cost centre, quota, members, priority entitlement)]; nobody is
# entitled to critical: that always takes an approved exception.
TENANTS = [
    (
        "acme-research",
        "Acme Research",
        {"gpus": D(48), "monthly_card_hours": D(20000)},
        [
            (
                "llm-pretraining",
                "LLM Pretraining",
                "CC-4100",
                {
                    "gpus": D(32),
                    "accelerator_memory_gb": 3072,
                    "cpu_cores": 768,
                    "memory_gb": 8192,
                    "concurrent_tasks": 12,
                    "monthly_card_hours": D(12000),
                },
                {"developer": Role.MEMBER, "approver": Role.APPROVER},
                PriorityClass.HIGH,
            ),
            (
                "vision",
                "Computer Vision",
                "CC-4200",
                {
                    "gpus": D(8),
                    "accelerator_memory_gb": 512,
                    "cpu_cores": 128,
                    "memory_gb": 1024,
                    "concurrent_tasks": 6,
                    "monthly_card_hours": D(2500),
                },
                {"developer": Role.MEMBER, "approver": Role.APPROVER},
                PriorityClass.STANDARD,
            ),
        ],
    ),
    (
        "acme-retail",
        "Acme Retail",
        None,
        [
            (
                "recommendations",
                "Recommendations",
                "CC-7300",
                {
                    "gpus": D(4),
                    "accelerator_memory_gb": 192,
                    "cpu_cores": 64,
                    "memory_gb": 512,
                    "concurrent_tasks": 4,
                    "monthly_card_hours": D(1500),
                },
                {"developer2": Role.MEMBER, "approver": Role.APPROVER},
                PriorityClass.HIGH,
            ),
        ],
    ),
]


def seed_tenancy(users: dict[str, User]) -> dict[str, Tenant]:
    tenants = {}
    for slug, name, cap, projects in TENANTS:
        tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(name=name, slug=slug, actor=None)
        tenants[slug] = tenant
        if cap and not hasattr(tenant, "quota"):
            quota = services.tenant_quota_ensure(tenant=tenant, actor=None)
            services.quota_set(quota=quota, limits=cap, actor=None, reason="Demo data")
        for project_slug, project_name, cost_centre, quota, members, entitlement in projects:
            project = Project.objects.filter(slug=project_slug).first() or services.project_create(
                tenant=tenant,
                name=project_name,
                slug=project_slug,
                lead=users["lead"],
                cost_centre=cost_centre,
                quota=quota,
                max_priority=entitlement,
                actor=None,
            )
            for username, role in members.items():
                services.membership_grant(project=project, user=users[username], role=role, actor=None)
    return tenants


def seed(context: dict) -> None:
    context["users"] = seed_people(context["password"])
    context["tenants"] = seed_tenancy(context["users"])


# The groups of `make run-sso`'s IdP and directory (devcluster/oidc_provider.py, ldap_directory.py) and what they
# give: research (ml-engineers inside it, as a nested group) orders for the pretraining project, research-approvers
# approve there, platform-ops are operators.
SSO_MAPPINGS = [
    ("research", GroupGrant.TENANT_MEMBER, "acme-research", None),
    ("research", GroupGrant.PROJECT_MEMBER, None, "llm-pretraining"),
    ("ml-engineers", GroupGrant.PROJECT_MEMBER, None, "recommendations"),
    ("research-approvers", GroupGrant.PROJECT_APPROVER, None, "llm-pretraining"),
    ("platform-ops", GroupGrant.OPERATOR, None, None),
]


def seed_group_mappings(author: User) -> list[GroupMapping]:
    """The demo's group mappings, written by the demo's operator (an operator rule applies only then); idempotent."""
    mappings = []
    for group, grant, tenant_slug, project_slug in SSO_MAPPINGS:
        mapping, _ = GroupMapping.objects.get_or_create(
            group=group,
            grant=grant,
            tenant=Tenant.objects.filter(slug=tenant_slug).first() if tenant_slug else None,
            project=Project.objects.filter(slug=project_slug).first() if project_slug else None,
            defaults={"written_by": author, "note": "make run-sso"},
        )
        mappings.append(mapping)
    return mappings
