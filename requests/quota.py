"""Quota arithmetic: what an order demands, what a project (and its tenant) already uses, what is left.

Usage = requests in committed states (pending approval through releasing) plus, for card-hours, what the
quota ledger says was metered this month and what committed work will still use: the demand of every committed
request not being released, less what the running ones have metered already (the ledger's `running_card_hours`),
so nothing counts twice. Only the ledger is read, so the arithmetic is the same whichever apps are installed.
Callers that decide on admission hold row locks on the tenant and project (see `lock_quota_scope`) so that
concurrent submissions see each other's demand.
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import date, timedelta
from decimal import Decimal

from django.db import connection
from django.utils import timezone

from config.words import amount
from requests.choices import COMMITTED_STATES, RequestState
from requests.models import ResourceRequest
from tenancy.choices import OrderCap, PriorityClass, QuotaDimension
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
    """Numbers as people write them: 8, 0.5, 12.25, a slice's 0.1429 of a card as 0.14 (at most two decimals)."""
    return amount(value)


def _json(value):
    return str(value) if isinstance(value, Decimal) else value


def month_start(today: date | None = None) -> date:
    return (today or timezone.now().date()).replace(day=1)


def next_month_start(today: date) -> date:
    return (today.replace(day=28) + timedelta(days=4)).replace(day=1)


# The usage sums are plain SQL, one statement for the committed demand and the metered ledger together: they are
# read on every preview, submission and quota panel, and the ORM's compilation of these grouped sums cost more than
# PostgreSQL's work (an index-only scan of request_committed_demand_idx).
# An advance reservation (requests/reservations.py) counts in the concurrent sums from its start on, and in a month's
# card-hours only in the month it starts: before that it holds nothing (admission judges its window apart).
_HELD_NOW = "(r.reserved_start IS NULL OR r.reserved_start <= %s)"
_COMMITTED_SUMS = (
    f"SUM(CASE WHEN {_HELD_NOW} THEN r.gpu_equivalents END), "
    f"SUM(CASE WHEN {_HELD_NOW} THEN r.accelerator_memory_gb END), SUM(CASE WHEN {_HELD_NOW} THEN r.cpu_cores END), "
    f"SUM(CASE WHEN {_HELD_NOW} THEN r.memory_gb END), COUNT(CASE WHEN {_HELD_NOW} THEN 1 END), "
    "SUM(CASE WHEN r.state <> %s AND (r.reserved_start IS NULL OR r.reserved_start < %s) THEN r.card_hours END)"
)
_HELD_NOW_SUMS = 5  # the sums of _COMMITTED_SUMS that read _HELD_NOW's moment
# How each grouping reaches its key from a request (r, joined with its project p) and from a ledger row (m).
_GROUPS = {
    "project_id": ("r.project_id", "", "m.project_id", ""),
    "project__tenant_id": (
        "p.tenant_id",
        f"JOIN {Project._meta.db_table} p ON p.id = r.project_id",
        "p.tenant_id",
        f"JOIN {Project._meta.db_table} p ON p.id = m.project_id",
    ),
}
_COMMITTED_KEYS = (
    *("gpus", "accelerator_memory_gb", "cpu_cores", "memory_gb", "concurrent_tasks", "committed_card_hours"),
)
_METERED_KEYS = ("card_hours", "running_card_hours")
_NOTHING_COMMITTED = dict.fromkeys(_COMMITTED_KEYS, 0) | {"gpus": ZERO, "committed_card_hours": ZERO}
_NOTHING_METERED = dict.fromkeys(_METERED_KEYS, ZERO)


def _demand_sums(key: str, ids: list[int], states) -> tuple[dict, dict]:
    """Per group ("project_id" or "project__tenant_id"): the demand of requests in `states`, and this month's
    ledger; groups without rows are left out (one query, none for no ids)."""
    if not ids:
        return {}, {}
    placeholders = ", ".join(["%s"] * len(ids))
    request_key, request_join, ledger_key, ledger_join = _GROUPS[key]
    states = sorted(states)
    sql = (
        f"SELECT {request_key}, 'committed', {_COMMITTED_SUMS}, NULL, NULL "
        f"FROM {ResourceRequest._meta.db_table} r {request_join} "
        f"WHERE {request_key} IN ({placeholders}) AND r.state IN ({', '.join(['%s'] * len(states))}) "
        f"GROUP BY {request_key} "
        f"UNION ALL SELECT {ledger_key}, 'metered', NULL, NULL, NULL, NULL, NULL, NULL, "
        f"SUM(m.card_hours), SUM(m.running_card_hours) FROM {MonthlyUsage._meta.db_table} m {ledger_join} "
        f"WHERE {ledger_key} IN ({placeholders}) AND m.month = %s GROUP BY {ledger_key}"
    )
    with connection.cursor() as cursor:
        now = timezone.now()
        sums = [*[now] * _HELD_NOW_SUMS, RequestState.RELEASING, next_month_start(now.date())]
        cursor.execute(sql, [*sums, *ids, *states, *ids, month_start()])
        rows = cursor.fetchall()
    committed = {row[0]: _as_sums(_COMMITTED_KEYS, row[2:8]) for row in rows if row[1] == "committed"}
    metered = {row[0]: _as_sums(_METERED_KEYS, row[8:10]) for row in rows if row[1] == "metered"}
    return committed, metered


def _as_sums(keys: tuple[str, ...], values) -> dict:
    """A row's sums by name, none as zero; decimals as decimals (SQLite, the demo's database, gives floats)."""
    return {
        key: _decimal(value) if key in _DECIMAL_SUMS else value or 0 for key, value in zip(keys, values, strict=True)
    }


_DECIMAL_SUMS = {"gpus", "committed_card_hours", "card_hours", "running_card_hours"}


def _decimal(value) -> Decimal:
    if value is None:
        return ZERO
    return value if isinstance(value, Decimal) else Decimal(str(value)).quantize(CARD_HOUR_PRECISION)


def _usage(committed: dict, metered: dict) -> dict[str, Decimal | int]:
    """Committed sums, with this month's card-hours: metered so far plus what committed work will still use."""
    usage = {key: value for key, value in committed.items() if key != "committed_card_hours"}
    # A request released since the ledger's refresh leaves its metered hours in `running_card_hours` until the next
    # one (its release triggers it); never let that count below nothing still to come.
    still_to_use = max(committed["committed_card_hours"] - metered["running_card_hours"], ZERO)
    usage[D.MONTHLY_CARD_HOURS] = (metered["card_hours"] + still_to_use).quantize(CARD_HOUR_PRECISION)
    return usage


def _added(sums: list[dict], nothing: dict) -> dict:
    return {key: sum((row[key] for row in sums), start=value) for key, value in nothing.items()}


def usage_of(project_ids: list[int]) -> dict[str, Decimal | int]:
    """Current usage per dimension of the given projects together (one query)."""
    committed, metered = _demand_sums("project_id", project_ids, COMMITTED_STATES)
    return _usage(
        _added(list(committed.values()), _NOTHING_COMMITTED), _added(list(metered.values()), _NOTHING_METERED)
    )


def _usage_grouped_by(key: str, ids: list[int]) -> dict[int, dict[str, Decimal | int]]:
    """Current usage of each project ("project_id") or tenant ("project__tenant_id"): one query."""
    committed, metered = _demand_sums(key, ids, COMMITTED_STATES)
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
    # The project's priority entitlement, kept on its quota (requests.priorities); None for a tenant's scope.
    max_priority: str | None = None
    # The project's own order caps by OrderCap value, None where it keeps the platform's default
    # (requests.order_caps); empty for a tenant's scope.
    order_caps: dict = field(default_factory=dict)

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
    """`quota_scopes` of many projects at once (at most three queries, however many projects and tenants)."""
    projects = {project.pk: project for project in projects}
    quotas = _quotas_of(list(projects))
    capped_tenants = {
        project.tenant_id: quotas[pk].tenant
        for pk, project in projects.items()
        if quotas[pk].tenant is not None and any(limit is not None for limit in quotas[pk].tenant.values())
    }
    project_usage = usage_by_project(list(projects))
    tenant_usage = _usage_grouped_by("project__tenant_id", list(capped_tenants))
    scopes = {}
    for pk, project in projects.items():
        quota = quotas[pk]
        scopes[pk] = [QuotaScope("project", quota.project, project_usage[pk], quota.max_priority, quota.order_caps)]
        if project.tenant_id in capped_tenants:
            scopes[pk].append(QuotaScope("tenant", capped_tenants[project.tenant_id], tenant_usage[project.tenant_id]))
    return scopes


@dataclass(frozen=True)
class _Quotas:
    project: dict  # its limits; every one None without a quota row
    max_priority: str
    order_caps: dict  # the project's own order caps (None: the platform's default)
    tenant: dict | None  # the tenant's limits, None without a tenant quota


def _quotas_of(project_ids: list[int]) -> dict[int, _Quotas]:
    """Each project's limits, priority entitlement and order caps with its tenant's limits: one plain statement (the
    ORM's join of the two one-to-one rows cost a millisecond to build on every order)."""
    if not project_ids:
        return {}
    limits = ", ".join(f"q.{dimension}" for dimension in D.values)
    caps = ", ".join(f"q.{cap.field}" for cap in OrderCap)
    sql = (
        f"SELECT p.id, q.id, q.max_priority, {caps}, {limits}, t.id, {limits.replace('q.', 't.')} "
        f"FROM {Project._meta.db_table} p "
        f"LEFT JOIN {ProjectQuota._meta.db_table} q ON q.project_id = p.id "
        f"LEFT JOIN {TenantQuota._meta.db_table} t ON t.tenant_id = p.tenant_id "
        f"WHERE p.id IN ({', '.join(['%s'] * len(project_ids))})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, project_ids)
        rows = cursor.fetchall()
    width, start = len(D.values), 3 + len(OrderCap)
    return {
        row[0]: _Quotas(
            project=_limits(row[start : start + width]),
            max_priority=row[2] or PriorityClass.STANDARD,  # no quota row: the field's default
            order_caps=dict(zip(OrderCap.values, row[3:start], strict=True)),
            tenant=None if row[start + width] is None else _limits(row[start + width + 1 :]),
        )
        for row in rows
    }


def _limits(values) -> dict[str, Decimal | int | None]:
    """A quota row's limits by dimension, decimals as decimals (SQLite, the demo's database, gives floats)."""
    return {
        dimension: value if value is None or dimension not in _DECIMAL_LIMITS else _limit_decimal(value)
        for dimension, value in zip(D.values, values, strict=True)
    }


_DECIMAL_LIMITS = {D.GPUS, D.MONTHLY_CARD_HOURS}


def _limit_decimal(value) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value)).quantize(LIMIT_PRECISION)


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
    counted = request.reserved_start is None or request.reserved_start <= timezone.now()  # see _HELD_NOW
    if request.state in COMMITTED_STATES and counted:
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
    if not connection.features.has_select_for_update:
        return  # SQLite (the demo): a write transaction begins holding the whole database (transaction_mode)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {Tenant._meta.db_table} WHERE id = %s FOR UPDATE", [project.tenant_id])
        cursor.execute(f"SELECT id FROM {Project._meta.db_table} WHERE id = %s FOR UPDATE", [project.pk])


def dimensions_over(demand: Demand, usage: list[DimensionImpact]) -> list[str]:
    """Labels of the dimensions where `demand` on top of current usage would pass the limit."""
    with_demand = (replace(row, requested=demand.get(row.dimension)) for row in usage)
    return [impact.label for impact in with_demand if not impact.fits]


def awaiting_approval(projects: Iterable[Project]) -> dict[tuple[str, int], dict[str, Decimal | int]]:
    """The demand of requests waiting for an approval decision, per project ("project", pk) and per tenant ("tenant",
    pk): admission counts it in `used` already, an approver wants to see it apart (two queries)."""
    projects = list(projects)
    totals = {}
    for scope, key, ids in (
        ("project", "project_id", [project.pk for project in projects]),
        ("tenant", "project__tenant_id", list({project.tenant_id for project in projects})),
    ):
        waiting, _metered = _demand_sums(key, ids, [RequestState.PENDING_APPROVAL])
        for pk in ids:
            row = dict(waiting.get(pk, _NOTHING_COMMITTED))
            row[D.MONTHLY_CARD_HOURS] = row.pop("committed_card_hours")
            totals[(scope, pk)] = row
    return totals
