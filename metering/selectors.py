"""Every metering read: usage reports, budgets and their burn-down, rightsizing evidence, the zero-touch KPI.

Aggregation happens in the database; Python only merges the few grouped rows. What a user sees is limited to the
projects they may view (operators see all), through tenancy's selector.
"""

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import reduce

from django.conf import settings
from django.db.models import Count, DecimalField, F, Max, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Cast, Coalesce, Least, TruncMonth
from django.utils import timezone

from catalog.models import AcceleratorModel, BareMetalProfile, ResourceSpec
from metering import rightsizing
from metering.choices import Grouping
from metering.expressions import card_hours, cost, overlapping, share_of_allocation
from metering.models import BudgetAlert, DailyUsage, IdleWatch, TokenUsage
from metering.periods import Period, days_of_month, first_of_month, month_period, months, next_month
from metering.telemetry import Binding
from requests.choices import RUNNING_STATES, RequestState
from requests.models import RequestEvent, ResourceRequest
from requests.quota import usage_by_project
from scheduling.models import Allocation, AllocationDevice, MigInstance, Node
from tenancy.choices import ProjectPermission, QuotaDimension
from tenancy.models import MonthlyUsage, Project, Tenant, User
from tenancy.selectors import projects_with_permission

G = Grouping
CARD_HOURS_PLACES, MONEY_PLACES = Decimal("0.0001"), Decimal("0.01")
SINCE_EVER = datetime(2000, 1, 1, tzinfo=UTC)


def visible_projects(*, user: User) -> QuerySet[Project]:
    return projects_with_permission(user=user, permission=ProjectPermission.VIEW)


# --- Telemetry ------------------------------------------------------------------------------------------------


def bindings_of(allocations: QuerySet[Allocation]) -> list[Binding]:
    """Every device share bound to the allocations, as telemetry drivers read them (one query)."""
    rows = (
        AllocationDevice.objects.filter(allocation__in=allocations)
        .annotate(
            gi_id=Subquery(
                MigInstance.objects.filter(allocation=OuterRef("allocation_id"), device=OuterRef("device_id")).values(
                    "gi_id"
                )[:1]
            )
        )
        .order_by("allocation_id", "device__index")
        .values_list(
            "allocation_id",
            "device_id",
            "device__uuid",
            "device__node__name",
            "device__memory_gb",
            "milli",
            "allocation__request__service__kind",
            "allocation__request__parameters",
            "gi_id",
            "device__model__vendor__slug",
        )
    )
    bindings, positions = [], {}
    for allocation_id, device_id, uuid, node, memory_gb, milli, kind, parameters, gi_id, vendor in rows:
        position = positions[allocation_id] = positions.get(allocation_id, -1) + 1
        bindings.append(
            Binding(
                allocation_id,
                device_id,
                uuid,
                node,
                position,
                memory_gb,
                milli,
                kind,
                str(parameters.get("workload", "")),
                gi_id,
                vendor,
            )
        )
    return bindings


# --- Card-hours, cost and energy, grouped ------------------------------------------------------------------

# The columns (ids: cheaper to group by than names) of each grouping, relative to an allocation; `model` stands for
# the accelerator model column of the rows grouped (a device binding's, or a daily rollup's).
_KEY_COLUMNS = {
    G.PROJECT: ["request__project_id"],
    G.TENANT: ["request__tenant_id"],
    G.SPEC: ["request__spec_id", "request__bare_metal_profile_id"],
    G.REQUEST: ["request_id"],
}
GANG_MEMBER = "member"  # not a grouping people ask for: a multi-node request's members, under its line
_KEY_COLUMNS[GANG_MEMBER] = ["member", "node_id"]


def _keys(prefix: str, model_column: str, group_by: list[str]) -> dict:
    columns = {
        **{key: [prefix + column for column in names] for key, names in _KEY_COLUMNS.items()},
        G.ACCELERATOR_MODEL: [model_column],
    }
    return {f"g_{key}_{n}": F(column) for key in group_by if key != G.MONTH for n, column in enumerate(columns[key])}


def _bound_in(
    projects: QuerySet[Project], periods: list[Period], group_by: list[str], now: datetime, members_only=False
) -> list:
    """Card-hours and cost per group and period: one grouped SELECT per period, sent as one UNION ALL query. By
    accelerator model, each device binding counts for its share of the allocation; else allocations count whole.
    `members_only`: only the allocations of multi-node gangs' members."""
    if G.ACCELERATOR_MODEL in group_by:
        rows, prefix, share = AllocationDevice.objects.all(), "allocation__", share_of_allocation()
    else:
        rows, prefix, share = Allocation.objects.all(), "", None
    keys = _keys(prefix, "device__model_id", group_by)
    rows = rows.filter(**{f"{prefix}request__project__in": projects.values("pk")}).annotate(**keys)
    if members_only:
        rows = rows.filter(**{f"{prefix}member__isnull": False})
    parts = [
        rows.filter(overlapping(prefix, period.start, period.end))
        .annotate(g_period=Value(period.label))
        .values("g_period", *keys)
        .annotate(
            card_hours=Sum(card_hours(prefix, period.start, period.end, now, share)),
            cost=Sum(cost(prefix, period.start, period.end, now, share)),
        )
        .order_by()
        for period in periods
    ]
    return _union_all(parts)


UNION_PARTS = 8  # SQLite's parser gives up on a few dozen of these SELECTs in one statement


def _union_all(parts: list[QuerySet]) -> list[dict]:
    """The parts' rows, UNION ALL-ed a few at a time (a month of days is four queries)."""
    chunks = [parts[start : start + UNION_PARTS] for start in range(0, len(parts), UNION_PARTS)]
    return [
        row for chunk in chunks for row in reduce(lambda union, part: union.union(part, all=True), chunk[1:], chunk[0])
    ]


def _energy_in(daily: QuerySet[DailyUsage], first: date, end: date, group_by: list[str]) -> list:
    keys = _keys("allocation__", "accelerator_model_id", group_by)
    return list(
        daily.filter(day__gte=first, day__lt=end)
        .annotate(g_month=TruncMonth("day"), **keys)
        .values("g_month", *keys)
        .annotate(energy_kwh=Sum("energy_kwh"))
        .order_by()
    )


def _group_key(row: dict, group_by: list[str], month: str) -> tuple:
    return tuple(
        month if key == G.MONTH else tuple(value for column, value in row.items() if column.startswith(f"g_{key}_"))
        for key in group_by
    )


def _slugs(model, ids: set) -> dict:
    return dict(model.objects.filter(pk__in=ids - {None}).values_list("pk", "slug")) if ids - {None} else {}


def _namer(group_by: list[str], keys: list[tuple]):
    """Turns a group key of ids into names: slugs for projects, tenants, models and specs (one query per kind)."""
    ids = {key: {group[index] for group in keys} for index, key in enumerate(group_by)}
    slugs = {
        G.PROJECT: _slugs(Project, {pk for (pk,) in ids.get(G.PROJECT, ())}),
        G.TENANT: _slugs(Tenant, {pk for (pk,) in ids.get(G.TENANT, ())}),
        G.ACCELERATOR_MODEL: _slugs(AcceleratorModel, {pk for (pk,) in ids.get(G.ACCELERATOR_MODEL, ())}),
    }
    specs = _slugs(ResourceSpec, {spec for spec, _ in ids.get(G.SPEC, ())})
    profiles = _slugs(BareMetalProfile, {profile for _, profile in ids.get(G.SPEC, ())})

    def name(key: str, value):
        if key == G.MONTH:
            return value
        if key == G.SPEC:
            return specs.get(value[0]) or profiles.get(value[1])
        return value[0] if key == G.REQUEST else slugs[key].get(value[0])

    return lambda group: {key: name(key, value) for key, value in zip(group_by, group, strict=True)}


def _decimal(value, places: Decimal) -> Decimal:
    return Decimal(value or 0).quantize(places)


def usage_report(
    *,
    user: User,
    first_month: date,
    last_month: date,
    group_by: list[str],
    project_id: int | None = None,
    tenant_id: int | None = None,
    now=None,
) -> list[dict]:
    """Card-hours, cost and energy of the visible projects per group, months `first_month`..`last_month`."""
    now = now or timezone.now()
    projects = visible_projects(user=user)
    if project_id:
        projects = projects.filter(pk=project_id)
    if tenant_id:
        projects = projects.filter(tenant_id=tenant_id)
    periods = months(first_month, last_month)
    daily = DailyUsage.objects.filter(allocation__request__project__in=projects.values("pk"))
    totals: dict[tuple, dict] = defaultdict(lambda: {"card_hours": 0.0, "cost": 0.0, "energy_kwh": 0.0})
    for row in _bound_in(projects, periods, group_by, now):
        total = totals[_group_key(row, group_by, row["g_period"])]
        total["card_hours"] += row["card_hours"] or 0
        total["cost"] += row["cost"] or 0
    for row in _energy_in(daily, periods[0].start.date(), periods[-1].end.date(), group_by):
        totals[_group_key(row, group_by, f"{row['g_month']:%Y-%m}")]["energy_kwh"] += row["energy_kwh"] or 0
    named = _namer(group_by, list(totals))
    members = _gang_members(projects, periods, group_by, now) if G.REQUEST in group_by else {}
    rows = [
        {
            **named(key),
            "card_hours": _decimal(total["card_hours"], CARD_HOURS_PLACES),
            "cost": _decimal(total["cost"], MONEY_PLACES),
            "energy_kwh": round(total["energy_kwh"], 3),
            "currency": settings.CATALOG_CURRENCY,
            **(_with_members(members.get(key, [])) if G.REQUEST in group_by else {}),
        }
        for key, total in totals.items()
    ]
    return sorted(rows, key=lambda row: tuple(str(row[key]) for key in group_by))


def _gang_members(projects, periods: list[Period], group_by: list[str], now: datetime) -> dict[tuple, list[dict]]:
    """Per line of a report grouped by request, the members of a multi-node request with their own card-hours and
    cost (a gang placed again lists both placements' members): one more query, and one for the node names."""
    figures: dict[tuple, dict[tuple, dict]] = defaultdict(dict)
    for row in _bound_in(projects, periods, [*group_by, GANG_MEMBER], now, members_only=True):
        line = _group_key(row, group_by, row["g_period"])
        member = figures[line].setdefault((row["g_member_0"], row["g_member_1"]), {"card_hours": 0.0, "cost": 0.0})
        member["card_hours"] += row["card_hours"] or 0
        member["cost"] += row["cost"] or 0
    node_ids = {node for members in figures.values() for _member, node in members}
    names = dict(Node.objects.filter(pk__in=node_ids).values_list("pk", "name")) if node_ids else {}
    return {
        line: [
            {
                "member": member,
                "node": names.get(node, ""),
                "card_hours": _decimal(figure["card_hours"], CARD_HOURS_PLACES),
                "cost": _decimal(figure["cost"], MONEY_PLACES),
            }
            for (member, node), figure in sorted(members.items())
        ]
        for line, members in figures.items()
    }


def _with_members(members: list[dict]) -> dict:
    """A request's line: how many nodes it ran on at once and, for a multi-node one, its members."""
    return {"nodes": len({member["member"] for member in members}) or 1, "members": members}


def card_hours_by_project(
    *, periods: list[Period], now=None, project_ids: list[int] | None = None
) -> dict[tuple[int, str], Decimal]:
    """{(project id, period label): card-hours} over every project (or those of `project_ids`): what the quota ledger
    stores."""
    now = now or timezone.now()
    allocations = Allocation.objects.annotate(g_project_id=F("request__project_id"))
    if project_ids is not None:
        allocations = allocations.filter(request__project_id__in=project_ids)
    parts = [
        allocations.filter(overlapping("", period.start, period.end))
        .annotate(g_period=Value(period.label))
        .values("g_period", "g_project_id")
        .annotate(card_hours=Sum(card_hours("", period.start, period.end, now)))
        .order_by()
        for period in periods
    ]
    return {
        (row["g_project_id"], row["g_period"]): _decimal(row["card_hours"], CARD_HOURS_PLACES)
        for row in _union_all(parts)
    }


def _metered_card_hours_of_request(now: datetime):
    """Card-hours metered up to `now` for the ResourceRequest named by OuterRef("pk"), all its allocations
    together."""
    return Cast(
        Subquery(
            Allocation.objects.filter(request=OuterRef("pk"))
            .order_by()
            .values("request")
            .annotate(hours=Sum(card_hours("", SINCE_EVER, now, now)))
            .values("hours")
        ),
        DecimalField(max_digits=20, decimal_places=6),
    )


def running_card_hours_by_project(*, now=None, project_ids: list[int] | None = None) -> dict[int, Decimal]:
    """{project id: card-hours} that requests still running have metered so far, each up to its own committed
    card-hours: the part of their demand the ledger already holds, so admission counts only the rest (every project,
    or those of `project_ids`)."""
    metered = Least(F("card_hours"), Coalesce(_metered_card_hours_of_request(now or timezone.now()), Decimal(0)))
    running = ResourceRequest.objects.filter(state__in=RUNNING_STATES)
    if project_ids is not None:
        running = running.filter(project_id__in=project_ids)
    rows = running.values("project_id").annotate(hours=Sum(metered)).values_list("project_id", "hours")
    return {project_id: _decimal(hours, CARD_HOURS_PLACES) for project_id, hours in rows}


def request_usage(resource_request: ResourceRequest, *, now=None) -> dict | None:
    """Card-hours, cost, energy and (a served model's) tokens of one request so far, all its allocations together,
    beside the cost approved for its whole duration (three queries); None while it never held an allocation. A
    multi-node gang's also each member's card-hours and cost (`members`). Registered as
    requests.hooks.REQUEST_USAGE."""
    now = now or timezone.now()
    # Grouped by member rather than aggregate(): one row (one per member of a gang), without aggregate()'s rewriting
    # of these long expressions (hashing every node of them), which was most of a request detail's time.
    rows = list(
        Allocation.objects.filter(request=resource_request)
        .order_by("member")
        .values("member")
        .annotate(card_hours=Sum(card_hours("", SINCE_EVER, now, now)), cost=Sum(cost("", SINCE_EVER, now, now)))
    )
    if not rows:  # the request never held an allocation
        return None
    bound = {key: sum(row[key] or 0 for row in rows) for key in ("card_hours", "cost")}
    members = [
        {
            "member": row["member"],
            "card_hours": _decimal(row["card_hours"], CARD_HOURS_PLACES),
            "cost": _decimal(row["cost"], MONEY_PLACES),
        }
        for row in rows
        if row["member"] is not None
    ]
    energy = DailyUsage.objects.filter(allocation__request=resource_request).aggregate(kwh=Sum("energy_kwh"))["kwh"]
    tokens = TokenUsage.objects.filter(request=resource_request).aggregate(
        prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    return {
        "card_hours": _decimal(bound["card_hours"], CARD_HOURS_PLACES),
        "energy_kwh": round(energy or 0.0, 3),
        "prompt_tokens": tokens["prompt"] or 0,
        "completion_tokens": tokens["completion"] or 0,
        "cost": _decimal(bound["cost"], MONEY_PLACES),
        "cost_approved": resource_request.cost_estimate,
        "currency": settings.CATALOG_CURRENCY,
        **({"members": members} if members else {}),
    }


# --- Budgets ------------------------------------------------------------------------------------------------


def budget_list(*, user: User, month: date | None = None, project_id: int | None = None) -> list[dict]:
    """The card-hour budget this month of each visible project that has one: limit, metered use, use with
    committed work, alerts."""
    month = first_of_month(month or timezone.now().date())
    projects = (
        visible_projects(user=user)
        .filter(quota__monthly_card_hours__isnull=False)
        .select_related("tenant", "quota")
        .order_by("tenant__name", "name")
    )
    if project_id:
        projects = projects.filter(pk=project_id)
    projects = list(projects)
    ids = [project.pk for project in projects]
    used = dict(MonthlyUsage.objects.filter(project_id__in=ids, month=month).values_list("project_id", "card_hours"))
    alerts = defaultdict(list)
    for alert in BudgetAlert.objects.filter(project_id__in=ids, month=month).order_by("created_at"):
        alerts[alert.project_id].append(alert)
    projected = usage_by_project(ids) if month == first_of_month(timezone.now().date()) else {}
    return [
        _budget_row(
            project,
            month,
            used.get(project.pk, Decimal(0)),
            projected.get(project.pk, {}).get(QuotaDimension.MONTHLY_CARD_HOURS),
            alerts[project.pk],
        )
        for project in projects
    ]


def _budget_row(project: Project, month: date, used: Decimal, projected, alerts: list[BudgetAlert]) -> dict:
    limit = project.quota.monthly_card_hours
    return {
        "project": project.slug,
        "project_name": project.name,
        "tenant": project.tenant.slug,
        "month": f"{month:%Y-%m}",
        "limit": limit,
        "used": used,
        "projected": projected,
        "used_pct": round(used / limit * 100, 1) if limit else None,
        "level": alerts[-1].level if alerts else None,
        "alerts": [
            {
                "level": alert.level,
                "message": alert.get_level_display(),
                "card_hours": alert.card_hours,
                "limit": alert.limit,
                "created_at": alert.created_at,
            }
            for alert in alerts
        ],
    }


def burn_down(*, project: Project, month: date | None = None, now=None) -> list[dict]:
    """Per day of the month so far: card-hours used since the 1st and what is left of the budget (one query)."""
    now = now or timezone.now()
    days = [period for period in days_of_month(month or now.date()) if period.start <= now]
    if not days:
        return []
    per_day = {
        row["g_period"]: _decimal(row["card_hours"], CARD_HOURS_PLACES)
        for row in _bound_in(Project.objects.filter(pk=project.pk), days, [], now)
    }
    limit, used, points = project.quota.monthly_card_hours, Decimal(0), []
    for period in days:
        used += per_day.get(period.label, Decimal(0))
        points.append(
            {
                "day": period.label,
                "used": used.quantize(CARD_HOURS_PLACES),
                "remaining": None if limit is None else (limit - used).quantize(CARD_HOURS_PLACES),
            }
        )
    return points


# --- Rightsizing ----------------------------------------------------------------------------------------------


def rightsizing_policy() -> rightsizing.Policy:
    return rightsizing.Policy(
        window_days=settings.METERING_RIGHTSIZING_WINDOW_DAYS,
        min_requests=settings.METERING_RIGHTSIZING_MIN_REQUESTS,
        max_mean_utilization_pct=settings.METERING_RIGHTSIZING_MAX_MEAN_UTILIZATION,
        headroom_pct=settings.METERING_RIGHTSIZING_HEADROOM_PERCENT,
    )


def _spec_shapes() -> dict[int, rightsizing.SpecShape]:
    """Every active spec in the shape rightsizing compares (two queries)."""
    specs = (
        ResourceSpec.objects.filter(status="active")
        .select_related("slice_profile")
        .prefetch_related("accelerator_models")
    )
    shapes = {}
    for spec in specs:
        models = list(spec.accelerator_models.all())
        label = spec.slice_profile.name if spec.is_slice else f"{spec.accelerator_count}x {models[0].name}"
        if spec.is_gang:  # its figures are the whole gang's: say so
            label = f"{spec.node_count} nodes x {label}"
        shapes[spec.pk] = rightsizing.SpecShape(
            spec.slug,
            label,
            spec.gpu_equivalents,
            spec.accelerator_memory_gb,
            spec.is_slice,
            frozenset(model.slug for model in models),
            spec.hourly_cost,
        )
    return shapes


def rightsizing_evidence(*, projects: QuerySet[Project], since: date, spec_id: int | None = None) -> list[dict]:
    daily = DailyUsage.objects.filter(
        day__gte=since, allocation__request__project__in=projects.values("pk"), allocation__request__spec__isnull=False
    )
    if spec_id is not None:
        daily = daily.filter(allocation__request__spec_id=spec_id)
    return list(
        daily.values(project=F("allocation__request__project__slug"), spec_id=F("allocation__request__spec_id"))
        .annotate(
            requests=Count("allocation__request", distinct=True),
            samples=Sum("samples"),
            device_samples=Sum("device_samples"),
            utilization_sum=Sum("utilization_sum"),
            memory_sum_mb=Sum("memory_sum_mb"),
            p95_busy_cards=Max("busy_cards_p95"),
            p95_memory_mb=Max("memory_p95_mb"),
        )
        .order_by("project", "spec_id")
    )


def _idle_card_hours_by_project_spec(*, projects: QuerySet[Project], since: date) -> dict[tuple[str, int], float]:
    """Idle card-hours of the ended idle episodes of requests whose watch changed in the window, per (project slug,
    spec id): one query."""
    rows = (
        IdleWatch.objects.filter(
            request__project__in=projects.values("pk"),
            request__spec__isnull=False,
            idle_card_seconds__gt=0,
            updated_at__date__gte=since,
        )
        .values_list("request__project__slug", "request__spec_id")
        .annotate(seconds=Sum("idle_card_seconds"))
        .order_by()
    )
    return {(slug, spec_id): seconds / 3600 for slug, spec_id, seconds in rows}


def recommendations(
    *, user: User, project_id: int | None = None, spec_id: int | None = None, today: date | None = None
) -> list[rightsizing.Recommendation]:
    """Rightsizing advice for the visible projects (or one project, one spec) over the policy's window."""
    policy = rightsizing_policy()
    today = today or timezone.now().date()
    projects = visible_projects(user=user)
    if project_id is not None:
        projects = projects.filter(pk=project_id)
    rows = rightsizing_evidence(projects=projects, since=today - timedelta(days=policy.window_days), spec_id=spec_id)
    if not rows:
        return []
    shapes = _spec_shapes()
    idle = _idle_card_hours_by_project_spec(projects=projects, since=today - timedelta(days=policy.window_days))
    advice = []
    for row in rows:
        requested = shapes.get(row["spec_id"])
        if requested is None:  # a spec deprecated since: nobody can order it again anyway
            continue
        evidence = rightsizing.Evidence(
            project=row["project"],
            spec=requested.slug,
            requests=row["requests"],
            mean_utilization_pct=row["utilization_sum"] / row["device_samples"],
            p95_busy_cards=row["p95_busy_cards"],
            p95_memory_gb=row["p95_memory_mb"] / 1024,
            mean_memory_gb=row["memory_sum_mb"] / row["samples"] / 1024,
            idle_card_hours=idle.get((row["project"], row["spec_id"]), 0.0),
        )
        recommendation = rightsizing.recommend(evidence, requested, list(shapes.values()), policy)
        if recommendation is not None:
            advice.append(recommendation)
    return advice


# --- Zero-touch delivery KPI ---------------------------------------------------------------------------------


def zero_touch_kpi(*, user: User, first_month: date, last_month: date, project_id: int | None = None) -> list[dict]:
    """Per service and month of delivery (first time active): requests delivered, those delivered with no manual
    operator intervention at any point of their life, and the interventions counted; of one project if given."""
    first_active = (
        RequestEvent.objects.filter(request=OuterRef("pk"), to_state=RequestState.ACTIVE)
        .order_by("created_at", "id")
        .values("created_at")[:1]
    )
    touches = (
        RequestEvent.objects.filter(request=OuterRef("pk"), intervention=True)
        .order_by()
        .values("request")
        .annotate(n=Count("id"))
        .values("n")
    )
    start, end = month_period(first_month).start, month_period(last_month).end
    projects = visible_projects(user=user)
    if project_id:
        projects = projects.filter(pk=project_id)
    rows = (
        ResourceRequest.objects.filter(project__in=projects.values("pk"))
        .annotate(delivered_at=Subquery(first_active), touches=Coalesce(Subquery(touches), 0))
        .filter(delivered_at__gte=start, delivered_at__lt=end)
        .values(service_slug=F("service__slug"), service_name=F("service__name"), month=TruncMonth("delivered_at"))
        .annotate(delivered=Count("id"), zero_touch=Count("id", filter=Q(touches=0)), interventions=Sum("touches"))
        .order_by("month", "service_name")
    )
    return [
        {
            "service": row["service_slug"],
            "service_name": row["service_name"],
            "month": f"{row['month']:%Y-%m}",
            "delivered": row["delivered"],
            "zero_touch": row["zero_touch"],
            "interventions": row["interventions"],
            "zero_touch_pct": round(100 * row["zero_touch"] / row["delivered"], 1),
        }
        for row in rows
    ]


def rightsizing_advice(user: User, project: Project | None, spec: ResourceSpec | None = None) -> list[dict]:
    """What the order form shows through requests.hooks: the project's advice for the spec being ordered; with no
    project, the advice for every project the user sees (the approval inbox matches it to its rows by slug)."""
    return [
        recommendation.as_data()
        for recommendation in recommendations(
            user=user,
            project_id=project.pk if project is not None else None,
            spec_id=spec.pk if spec is not None else None,
        )
    ]


# --- Tokens served by the gateway --------------------------------------------------------------------------


def token_usage(*, user: User, first_month: date, last_month: date, project_id: int | None = None) -> list[dict]:
    """Input and output tokens per project, model and month, from the gateway's ledger (one query); of one project
    if given."""
    projects = visible_projects(user=user)
    if project_id:
        projects = projects.filter(pk=project_id)
    rows = (
        TokenUsage.objects.filter(
            project__in=projects.values("pk"), day__gte=first_month, day__lt=next_month(last_month)
        )
        .values("model", project_slug=F("project__slug"), month=TruncMonth("day"))
        .annotate(
            requests=Sum("requests"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens")
        )
        .order_by("month", "project_slug", "model")
    )
    return [
        {
            "month": f"{row['month']:%Y-%m}",
            "project": row["project_slug"],
            "model": row["model"],
            "requests": row["requests"],
            "prompt_tokens": row["prompt_tokens"],
            "completion_tokens": row["completion_tokens"],
            "total_tokens": row["prompt_tokens"] + row["completion_tokens"],
        }
        for row in rows
    ]
