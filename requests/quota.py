"""Quota arithmetic: what an order demands, what a project (and its tenant) already uses, what is left.

Usage = requests in committed states (pending approval through releasing) plus, for card-hours, what the
quota ledger says was metered this month. Callers that decide on admission hold row locks on the tenant and
project (see `lock_quota_scope`) so that concurrent submissions see each other's demand.
"""

from dataclasses import asdict, dataclass
from datetime import date
from decimal import Decimal

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from requests.choices import COMMITTED_STATES
from requests.models import ResourceRequest
from tenancy.choices import QuotaDimension
from tenancy.models import MonthlyUsage, Project, ProjectQuota, Tenant, TenantQuota

D = QuotaDimension
ZERO = Decimal(0)
LIMIT_PRECISION = Decimal("0.01")  # decimal places of the quota limit fields


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
        return cls(gpus=request.gpu_equivalents, accelerator_memory_gb=request.accelerator_memory_gb,
                   cpu_cores=request.cpu_cores, memory_gb=request.memory_gb, concurrent_tasks=1,
                   monthly_card_hours=request.card_hours)


@dataclass(frozen=True)
class DimensionImpact:
    scope: str  # "project" or "tenant"
    dimension: str
    used: Decimal | int
    requested: Decimal | int
    limit: Decimal | int | None

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
    def message(self) -> str:
        label = D(self.dimension).label
        where = "the tenant" if self.scope == "tenant" else "the project"
        if self.limit is None:
            return f"{label}: no limit for {where}."
        left = max(self.limit - self.used, 0)
        verdict = "fits" if self.fits else "over the limit"
        return (f"{label}: this request needs {_fmt(self.requested)}; {where} uses {_fmt(self.used)} of "
                f"{_fmt(self.limit)} ({_fmt(left)} left) — {verdict}.")

    def as_data(self) -> dict:
        data = {key: _json(value) for key, value in asdict(self).items()}
        return {**data, "remaining_after": _json(self.remaining_after), "fits": self.fits, "message": self.message}

    def as_reason(self) -> dict:
        data = self.as_data()
        return {"code": "quota_exceeded", **{key: data[key] for key in
                                              ("scope", "dimension", "requested", "used", "limit", "message")}}


def _fmt(value) -> str:
    """Numbers as people write them: 8, 0.5, 12.25 (no trailing zeros)."""
    text = f"{value:f}" if isinstance(value, Decimal) else str(value)
    return text.rstrip("0").rstrip(".") if "." in text else text


def _json(value):
    return str(value) if isinstance(value, Decimal) else value


def month_start(today: date | None = None) -> date:
    return (today or timezone.now().date()).replace(day=1)


def usage_of(project_ids: list[int]) -> dict[str, Decimal | int]:
    """Current usage per dimension of the given projects together (two queries)."""
    committed = ResourceRequest.objects.filter(project_id__in=project_ids, state__in=COMMITTED_STATES).aggregate(
        gpus=Coalesce(Sum("gpu_equivalents"), ZERO),
        accelerator_memory_gb=Coalesce(Sum("accelerator_memory_gb"), 0),
        cpu_cores=Coalesce(Sum("cpu_cores"), 0),
        memory_gb=Coalesce(Sum("memory_gb"), 0),
        concurrent_tasks=Count("id"),
        projected_card_hours=Coalesce(Sum("card_hours"), ZERO),
    )
    metered = MonthlyUsage.objects.filter(project_id__in=project_ids, month=month_start()).aggregate(
        hours=Coalesce(Sum("card_hours"), ZERO))["hours"]
    # Committed projections count whole; metering refines this to the unmetered remainder of running work.
    committed[D.MONTHLY_CARD_HOURS] = metered + committed.pop("projected_card_hours")
    return committed


def _impacts(scope: str, limits: dict, usage: dict, demand: Demand) -> list[DimensionImpact]:
    return [DimensionImpact(scope, dimension, usage[dimension], demand.get(dimension), limits[dimension])
            for dimension in D.values]


def quota_impact(project: Project, demand: Demand) -> list[DimensionImpact]:
    """Impact on every project dimension, then on every capped tenant dimension."""
    quota = ProjectQuota.objects.filter(project=project).first()
    limits = quota.limits() if quota else dict.fromkeys(D.values)
    impacts = _impacts("project", limits, usage_of([project.pk]), demand)
    tenant_quota = TenantQuota.objects.filter(tenant_id=project.tenant_id).first()
    if tenant_quota is not None:
        capped = {dim: limit for dim, limit in tenant_quota.limits().items() if limit is not None}
        if capped:
            tenant_projects = list(Project.objects.filter(tenant_id=project.tenant_id).values_list("pk", flat=True))
            tenant_usage = usage_of(tenant_projects)
            impacts += [impact for impact in _impacts("tenant", tenant_quota.limits(), tenant_usage, demand)
                        if impact.dimension in capped]
    return impacts


def exceeded(impacts: list[DimensionImpact]) -> list[dict]:
    return [impact.as_reason() for impact in impacts if not impact.fits]


def lock_quota_scope(project: Project) -> None:
    """Serialise admission per tenant: lock the tenant row, then the project row (always in that order)."""
    Tenant.objects.select_for_update().filter(pk=project.tenant_id).get()
    Project.objects.select_for_update().filter(pk=project.pk).get()
