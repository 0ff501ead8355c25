"""Quota arithmetic: what an order demands, what a project (and its tenant) already uses, what is left.

Usage = requests in committed states (pending approval through releasing) plus, for card-hours, what the
quota ledger says was metered this month and what committed work will still use: the demand of every committed
request not being released, less what the running ones have metered already (the ledger's `running_card_hours`),
so nothing counts twice. Only the ledger is read, so the arithmetic is the same whichever apps are installed.
Callers that decide on admission hold row locks on the tenant and project (see `lock_quota_scope`) so that
concurrent submissions see each other's demand.
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import date
from decimal import Decimal

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from requests.choices import COMMITTED_STATES, RequestState
from requests.models import ResourceRequest
from tenancy.choices import QuotaDimension
from tenancy.models import MonthlyUsage, Project, ProjectQuota, Tenant, TenantQuota

D = QuotaDimension
ZERO = Decimal(0)
LIMIT_PRECISION = Decimal("0.01")  # decimal places of the quota limit fields
CARD_HOUR_PRECISION = Decimal("0.0001")  # decimal places of card-hours on requests and in the ledger


@dataclass(frozen=True)
class Demand:
    """What one request counts against each quota dimension."""

    gpus: Decimal
    accelerator_memory_gb: int
    cpu_cores: int
    memory_gb: int
    concurrent_tasks: int
    monthly_card_hours: Decimal

    def get(self, dimension: str):
        return getattr(self, dimension)

    @classmethod
    def of(cls, request: ResourceRequest) -> "Demand":
        return cls(
            gpus=request.gpu_equivalents,
            accelerator_memory_gb=request.accelerator_memory_gb,
            cpu_cores=request.cpu_cores,
            memory_gb=request.memory_gb,
            concurrent_tasks=1,
            monthly_card_hours=request.card_hours,
        )


@dataclass(frozen=True)
class DimensionImpact:
    scope: str  # "project" or "tenant"
    dimension: str
    used: Decimal | int
    requested: Decimal | int
    limit: Decimal | int | None

    @property
    def label(self) -> str:
        return D(self.dimension).label

    @property
    def remaining_after(self):
        return None if self.limit is None else self.limit - self.used - self.requested

    @property
    def fits(self) -> bool:
        if self.limit is None:
            return True
        total = self.used + self.requested
        if isinstance(total, Decimal):
            # Limits are kept to 0.01; compare at that precision so that slice fractions rounded to four
            # places (1g.10gb = 0.1429 of a card) add up to whole cards: 7 x 0.1429 = 1.0003 fits a limit of 1.
            total = total.quantize(LIMIT_PRECISION)
        return total <= self.limit

    @property
    def beyond_limit(self) -> bool:
        """The request alone passes the limit: no amount of usage freeing up could ever admit it."""
        return not replace(self, used=0).fits

    @property
    def message(self) -> str:
        label = self.label
        where = self.where
        if self.limit is None:
            return f"{label}: no limit for {where}."
        left = max(self.limit - self.used, 0)
        verdict = "fits" if self.fits else "over the limit"
        return (
            f"{label}: this request needs {_fmt(self.requested)}; {where} uses {_fmt(self.used)} of "
            f"{_fmt(self.limit)} ({_fmt(left)} left) — {verdict}."
        )

    @property
    def where(self) -> str:
        return "the tenant" if self.scope == "tenant" else "the project"

    def as_data(self) -> dict:
        data = {key: _json(value) for key, value in asdict(self).items()}
        return {
            **data,
            "label": self.label,
            "remaining_after": _json(self.remaining_after),
            "fits": self.fits,
            "message": self.message,
        }

    def as_reason(self) -> dict:
        data = self.as_data()
        return {
            "code": "quota_exceeded",
            **{key: data[key] for key in ("scope", "dimension", "requested", "used", "limit", "message")},
        }


def _fmt(value) -> str:
    """Numbers as people write them: 8, 0.5, 12.25 (no trailing zeros)."""
    text = f"{value:f}" if isinstance(value, Decimal) else str(value)
    return text.rstrip("0").rstrip(".") if "." in text else text


def _json(value):
    return str(value) if isinstance(value, Decimal) else value


def month_start(today: date | None = None) -> date:
    return (today or timezone.now().date()).replace(day=1)


def _committed_card_hours():
    """The demand of committed requests, except those being released: what they used is in the ledger already."""
    return Coalesce(Sum("card_hours", filter=~Q(state=RequestState.RELEASING)), ZERO)


def _committed_totals() -> dict:
    """Sums over requests in committed states; `_usage` adds the ledger to the projected card-hours."""
    return {
        "gpus": Coalesce(Sum("gpu_equivalents"), ZERO),
        "accelerator_memory_gb": Coalesce(Sum("accelerator_memory_gb"), 0),
        "cpu_cores": Coalesce(Sum("cpu_cores"), 0),
        "memory_gb": Coalesce(Sum("memory_gb"), 0),
        "concurrent_tasks": Count("id"),
        "committed_card_hours": _committed_card_hours(),
    }


_NOTHING_COMMITTED = {
    "gpus": ZERO,
    "accelerator_memory_gb": 0,
    "cpu_cores": 0,
    "memory_gb": 0,
    "concurrent_tasks": 0,
    "committed_card_hours": ZERO,
}

_NOTHING_METERED = {"card_hours": ZERO, "running_card_hours": ZERO}


def _metered_totals() -> dict:
    return {
        "card_hours": Coalesce(Sum("card_hours"), ZERO),
        "running_card_hours": Coalesce(Sum("running_card_hours"), ZERO),
    }


def _usage(committed: dict, metered: dict) -> dict[str, Decimal | int]:
    """Committed sums, with this month's card-hours: metered so far plus what committed work will still use."""
    usage = {key: value for key, value in committed.items() if key != "committed_card_hours"}
    # A request released since the ledger's refresh leaves its metered hours in `running_card_hours` until the next
    # one (its release triggers it); never let that count below nothing still to come.
    still_to_use = max(committed["committed_card_hours"] - metered["running_card_hours"], ZERO)
    usage[D.MONTHLY_CARD_HOURS] = (metered["card_hours"] + still_to_use).quantize(CARD_HOUR_PRECISION)
    return usage


def usage_of(project_ids: list[int]) -> dict[str, Decimal | int]:
    """Current usage per dimension of the given projects together (two queries)."""
    committed = ResourceRequest.objects.filter(project_id__in=project_ids, state__in=COMMITTED_STATES).aggregate(
        **_committed_totals()
    )
    metered = MonthlyUsage.objects.filter(project_id__in=project_ids, month=month_start()).aggregate(
        **_metered_totals()
    )
    return _usage(committed, metered)


def _usage_grouped_by(key: str, ids: list[int]) -> dict[int, dict[str, Decimal | int]]:
    """Current usage of each project ("project_id") or tenant ("project__tenant_id"): two grouped queries."""
    committed = {
        row.pop(key): row
        for row in ResourceRequest.objects.filter(**{f"{key}__in": ids}, state__in=COMMITTED_STATES)
        .order_by()  # a grouped sum has no order; the model's default costs compiling (and then is dropped)
        .values(key)
        .annotate(**_committed_totals())
    }
    metered = {
        row.pop(key): row
        for row in MonthlyUsage.objects.filter(**{f"{key}__in": ids}, month=month_start())
        .order_by()
        .values(key)
        .annotate(**_metered_totals())
    }
    return {pk: _usage(committed.get(pk, _NOTHING_COMMITTED), metered.get(pk, _NOTHING_METERED)) for pk in ids}


def usage_by_project(project_ids: list[int]) -> dict[int, dict[str, Decimal | int]]:
    """Current usage of each project separately; the query count does not grow with the number of projects."""
    return _usage_grouped_by("project_id", project_ids)


@dataclass(frozen=True)
class QuotaScope:
    """Limits and current usage of one scope (the project, or its capped tenant)."""

    name: str
    limits: dict
    usage: dict

    def impacts(self, demand: Demand) -> list[DimensionImpact]:
        return [
            DimensionImpact(self.name, dimension, self.usage[dimension], demand.get(dimension), self.limits[dimension])
            for dimension in D.values
            if self.name == "project" or self.limits[dimension] is not None
        ]


def quota_scopes(project: Project) -> list[QuotaScope]:
    """The project's scope, and the tenant's when the tenant caps any dimension."""
    return quota_scopes_by_project([project])[project.pk]


def quota_scopes_by_project(projects: Iterable[Project]) -> dict[int, list[QuotaScope]]:
    """`quota_scopes` of many projects at once (at most six queries, however many projects and tenants)."""
    projects = {project.pk: project for project in projects}
    project_limits = {
        quota.project_id: quota.limits() for quota in ProjectQuota.objects.filter(project_id__in=projects)
    }
    tenant_quotas = TenantQuota.objects.filter(tenant_id__in={project.tenant_id for project in projects.values()})
    capped_tenants = {
        quota.tenant_id: quota.limits()
        for quota in tenant_quotas
        if any(limit is not None for limit in quota.limits().values())
    }
    project_usage = usage_by_project(list(projects))
    tenant_usage = _usage_grouped_by("project__tenant_id", list(capped_tenants))
    scopes = {}
    for pk, project in projects.items():
        scopes[pk] = [QuotaScope("project", project_limits.get(pk, dict.fromkeys(D.values)), project_usage[pk])]
        if project.tenant_id in capped_tenants:
            scopes[pk].append(QuotaScope("tenant", capped_tenants[project.tenant_id], tenant_usage[project.tenant_id]))
    return scopes


def quota_impact(project: Project, demand: Demand, scopes: list[QuotaScope] | None = None) -> list[DimensionImpact]:
    """Impact on every project dimension, then on every capped tenant dimension."""
    return [impact for scope in (scopes or quota_scopes(project)) for impact in scope.impacts(demand)]


def request_quota_impact(request: ResourceRequest, scopes: list[QuotaScope] | None = None) -> list[DimensionImpact]:
    """Where a stored request stands against its quota now.

    A request awaiting approval already counts in `used`; its demand is taken out there so that it shows once,
    as `requested`, and an approver sees whether approving it keeps the project within its limits.
    """
    demand = Demand.of(request)
    scopes = scopes or quota_scopes(request.project)
    if request.state in COMMITTED_STATES:
        scopes = [
            replace(scope, usage={dimension: used - demand.get(dimension) for dimension, used in scope.usage.items()})
            for scope in scopes
        ]
    return quota_impact(request.project, demand, scopes)


def exceeded(impacts: list[DimensionImpact]) -> list[dict]:
    return [impact.as_reason() for impact in impacts if not impact.fits]


def beyond_limits(impacts: list[DimensionImpact]) -> list[dict]:
    """Reasons (`exceeds_limit`) for the dimensions the request alone passes: waiting for quota never helps there."""
    return [
        {
            **impact.as_reason(),
            "code": "exceeds_limit",
            "message": f"{impact.label}: this request alone needs {_fmt(impact.requested)}, more than the limit of "
            f"{_fmt(impact.limit)} for {impact.where}; waiting for quota to free up can never admit it.",
        }
        for impact in impacts
        if impact.beyond_limit
    ]


def lock_quota_scope(project: Project) -> None:
    """Serialise admission per tenant: lock the tenant row, then the project row (always in that order)."""
    Tenant.objects.select_for_update().filter(pk=project.tenant_id).get()
    Project.objects.select_for_update().filter(pk=project.pk).get()


def dimensions_over(demand: Demand, usage: list[DimensionImpact]) -> list[str]:
    """Labels of the dimensions where `demand` on top of current usage would pass the limit."""
    with_demand = (replace(row, requested=demand.get(row.dimension)) for row in usage)
    return [impact.label for impact in with_demand if not impact.fits]


def awaiting_approval(projects: Iterable[Project]) -> dict[tuple[str, int], dict[str, Decimal | int]]:
    """The demand of requests waiting for an approval decision, per project ("project", pk) and per tenant ("tenant",
    pk): admission counts it in `used` already, an approver wants to see it apart (two grouped queries)."""
    projects = list(projects)
    totals = {"project": {}, "tenant": {}}
    for scope, key, ids in (
        ("project", "project_id", [project.pk for project in projects]),
        ("tenant", "project__tenant_id", list({project.tenant_id for project in projects})),
    ):
        rows = (
            ResourceRequest.objects.filter(**{f"{key}__in": ids}, state=RequestState.PENDING_APPROVAL)
            .values(key)
            .annotate(**_committed_totals())
        )
        for row in rows:
            pk = row.pop(key)
            row[D.MONTHLY_CARD_HOURS] = row.pop("committed_card_hours")
            totals[scope][pk] = row
    nothing = {**{k: v for k, v in _NOTHING_COMMITTED.items() if k != "committed_card_hours"}}
    nothing[D.MONTHLY_CARD_HOURS] = ZERO
    return {
        **{("project", project.pk): totals["project"].get(project.pk, nothing) for project in projects},
        **{("tenant", project.tenant_id): totals["tenant"].get(project.tenant_id, nothing) for project in projects},
    }
