"""The usage page: card-hours, cost and energy over time, budgets and their burn-down, idle card-hours against the
card-hours held, rightsizing advice and the zero-touch KPI of the projects the user may see. The operator console
shows the same figures (admin.py)."""

from collections import defaultdict
from datetime import date
from decimal import Decimal
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone

from catalog.models import AcceleratorModel
from metering import selectors
from metering.books.selectors import reserved_idle_report, slurm_books_report
from metering.charts import bar_chart, burn_down_chart
from metering.choices import Grouping
from metering.forms import UsageFilterForm
from metering.idle.selectors import idle_report
from metering.periods import days_of_month, months
from tenancy.models import Project, User

G = Grouping


def _totals(rows: list[dict], key: str, order: list[str] | None = None) -> list[dict]:
    """The report's rows added up per value of one of its keys (a handful of rows: Python is fine here)."""
    totals = defaultdict(lambda: {"card_hours": Decimal(0), "cost": Decimal(0), "energy_kwh": 0.0})
    for row in rows:
        for measure in ("card_hours", "cost", "energy_kwh"):
            totals[row[key]][measure] += row[measure]
    names = order if order is not None else sorted(totals, key=str)
    return [{"name": name, **totals[name]} for name in names]


def _burn_down(project: Project | None, now) -> dict | None:
    if project is None or project.quota.monthly_card_hours is None:
        return None
    points = selectors.burn_down(project=project, now=now)
    return burn_down_chart(
        f"Budget burn-down of {project.name}, {now:%B %Y}",
        "card-hours",
        [period.label for period in days_of_month(now.date())],
        [float(point["remaining"]) for point in points],
        float(project.quota.monthly_card_hours),
    )


def _display_names(user: User) -> tuple[dict[str, str], dict[str, str]]:
    """What the report's slugs are called where people read them: each visible project as "Tenant / Project" (as the
    filter and every other page spell it), each accelerator model as its catalog name (two queries)."""
    visible = selectors.visible_projects(user=user).select_related("tenant")
    projects = {project.slug: str(project) for project in visible}
    models = {model.slug: str(model) for model in AcceleratorModel.objects.select_related("vendor")}
    return projects, models


def _named(rows: list[dict], names: dict[str, str]) -> list[dict]:
    return [{**row, "name": names.get(row["name"], row["name"])} for row in rows]


# The requests listed under "Idle card-hours": the most idle first; the usage API (/api/v1/usage/idle/) has them all.
IDLE_REQUESTS_SHOWN = 20


def _idle(*, user: User, project_id: int | None, first: date, last: date, project_names: dict[str, str]) -> dict:
    """Card-hours held (requested) against used and idle (metering.idle's ended idle episodes), per project and for
    the requests that sat idle longest."""
    report = idle_report(user=user, first_month=first, last_month=last, project_id=project_id)
    idle_requests = sorted(
        (line for line in report["requests"] if line["idle_card_hours"] > 0),
        key=lambda line: (-line["idle_card_hours"], line["request"]),
    )
    return {
        "projects": [
            {**line, "project_label": project_names.get(line["project"], line["project"]), "idle_pct": _share(line)}
            for line in report["projects"]
        ],
        "requests": [{**line, "idle_pct": _share(line)} for line in idle_requests[:IDLE_REQUESTS_SHOWN]],
        "requests_not_shown": max(0, len(idle_requests) - IDLE_REQUESTS_SHOWN),
    }


def _share(line: dict) -> float:
    return round(100 * line["idle_card_hours"] / line["card_hours"], 1) if line["card_hours"] else 0.0


# The requests listed under "Slurm's books": the largest differences first; the usage API has them all.
BOOKS_REQUESTS_SHOWN = 20


def _slurm_books(*, user: User, project_id: int | None, first: date, last: date, project_names: dict) -> dict:
    rows = sorted(
        slurm_books_report(user=user, first_month=first, last_month=last, project_id=project_id),
        key=lambda row: (-abs(row["difference_card_hours"]), row["request"]),
    )
    return {
        "requests": [
            {**row, "project_label": project_names.get(row["project"], row["project"])}
            for row in rows[:BOOKS_REQUESTS_SHOWN]
        ],
        "not_shown": max(0, len(rows) - BOOKS_REQUESTS_SHOWN),
    }


def _reserved_idle(*, user: User, project_id: int | None, first: date, last: date, now, project_names: dict):
    rows = reserved_idle_report(user=user, first_month=first, last_month=last, project_id=project_id, now=now)
    return [{**row, "project_label": project_names.get(row["project"], row["project"])} for row in rows]


def _multi_node(*, user: User, project_id: int | None, first: date, last: date, now) -> list[dict]:
    """The multi-node requests of these months, each one line with its members (their nodes and figures): the
    report grouped by request, a fixed number of queries however many there are."""
    rows = selectors.usage_report(
        user=user, first_month=first, last_month=last, project_id=project_id, group_by=[G.REQUEST], now=now
    )
    return [row for row in rows if row["nodes"] > 1]


def usage_context(*, user: User, project: Project | None, first: date, last: date) -> dict:
    now = timezone.now()
    project_names, model_names = _display_names(user)
    project_id = project.pk if project is not None else None
    rows = selectors.usage_report(
        user=user,
        first_month=first,
        last_month=last,
        project_id=project_id,
        group_by=[G.PROJECT, G.ACCELERATOR_MODEL, G.MONTH],
        now=now,
    )
    by_month = _totals(rows, G.MONTH, order=[period.label for period in months(first, last)])
    query = {
        "group_by": "project,tenant,accelerator_model,spec,month",
        "from": f"{first:%Y-%m}",
        "to": f"{last:%Y-%m}",
        **({"project": project_id} if project_id else {}),
    }
    return {
        "first": first,
        "last": last,
        "project": project,
        "currency": settings.CATALOG_CURRENCY,
        "charts": [
            bar_chart("Card-hours per month", "card-hours", [(m["name"], float(m["card_hours"])) for m in by_month]),
            bar_chart("Cost per month", settings.CATALOG_CURRENCY, [(m["name"], float(m["cost"])) for m in by_month]),
            bar_chart("Energy per month", "kWh", [(m["name"], m["energy_kwh"]) for m in by_month]),
        ],
        "by_month": by_month,
        "by_project": _named(_totals(rows, G.PROJECT), project_names),
        "by_model": _named(_totals(rows, G.ACCELERATOR_MODEL), model_names),
        "multi_node": _multi_node(user=user, project_id=project_id, first=first, last=last, now=now),
        "budgets": [
            {**budget, "project_label": project_names.get(budget["project"], budget["project_name"])}
            for budget in selectors.budget_list(user=user, project_id=project_id)
        ],
        "burn_down": _burn_down(project, now),
        "recommendations": [
            {**advice, "project_label": project_names.get(advice["project"], advice["project"])}
            for advice in (found.as_data() for found in selectors.recommendations(user=user, project_id=project_id))
        ],
        "idle": _idle(user=user, project_id=project_id, first=first, last=last, project_names=project_names),
        "reserved_idle": _reserved_idle(
            user=user, project_id=project_id, first=first, last=last, now=now, project_names=project_names
        ),
        "slurm_books": _slurm_books(
            user=user, project_id=project_id, first=first, last=last, project_names=project_names
        ),
        "kpi": selectors.zero_touch_kpi(user=user, first_month=first, last_month=last, project_id=project_id),
        "tokens": [
            {**row, "project_label": project_names.get(row["project"], row["project"])}
            for row in selectors.token_usage(user=user, first_month=first, last_month=last, project_id=project_id)
        ],
        "export_query": urlencode(query),
    }


@login_required
def usage(request):
    form = UsageFilterForm(request.GET, user=request.user)  # every field is optional: no filter is a valid one
    if not form.is_valid():
        return render(request, "metering/usage.html", {"form": form}, status=400)
    chosen = form.cleaned_data
    return render(
        request,
        "metering/usage.html",
        {
            "form": form,
            **usage_context(user=request.user, project=chosen["project"], first=chosen["first"], last=chosen["last"]),
        },
    )
