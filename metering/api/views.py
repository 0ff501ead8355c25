"""Usage API: card-hours, cost and energy grouped as asked (JSON or CSV), budgets, rightsizing, zero-touch KPI.

Views parse the query, call a selector and shape the answer; selectors decide what the caller may see.
"""

import csv

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers as drf
from rest_framework.response import Response
from rest_framework.views import APIView

from metering import selectors
from metering.api import serializers
from metering.books.selectors import reserved_idle_report, slurm_books_report
from metering.idle.selectors import idle_report

PERIOD_PARAMETERS = [
    OpenApiParameter("from", str, description="First month, YYYY-MM (default: five months ago)."),
    OpenApiParameter("to", str, description="Last month, YYYY-MM (default: this month)."),
]
REPORT_PARAMETERS = [
    *PERIOD_PARAMETERS,
    OpenApiParameter(
        "group_by",
        str,
        description="Comma-separated: project, tenant, "
        "accelerator_model, spec, month, request (default: project,month).",
    ),
    OpenApiParameter("project", int),
    OpenApiParameter("tenant", int),
]


def _query(serializer_class, request) -> dict:
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data


def _report(request) -> tuple[dict, list[dict]]:
    query = _query(serializers.ReportQuerySerializer, request)
    rows = selectors.usage_report(
        user=request.user,
        first_month=query["first"],
        last_month=query["last"],
        group_by=query["group_by"],
        project_id=query.get("project"),
        tenant_id=query.get("tenant"),
    )
    return query, rows


class UsageReportView(APIView):
    @extend_schema(
        parameters=REPORT_PARAMETERS,
        responses=inline_serializer(
            "UsageReport",
            {
                "from": drf.CharField(),
                "to": drf.CharField(),
                "group_by": drf.ListField(child=drf.CharField()),
                "results": serializers.UsageRowSerializer(many=True),
            },
        ),
        description="Card-hours (whole cards count 1, slices their fraction), cost (hours x the spec's price) and "
        "energy of the projects you may see, per group. Running allocations count up to now.",
    )
    def get(self, request):
        query, rows = _report(request)
        return Response(
            {
                "from": f"{query['first']:%Y-%m}",
                "to": f"{query['last']:%Y-%m}",
                "group_by": query["group_by"],
                "results": serializers.UsageRowSerializer(rows, many=True).data,
            }
        )


class UsageExportView(APIView):
    @extend_schema(
        parameters=REPORT_PARAMETERS,
        responses={(200, "text/csv"): str},
        description="The same report as CSV, one row per group.",
    )
    def get(self, request):
        query, rows = _report(request)
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = (
            f'attachment; filename="usage-{query["first"]:%Y-%m}-{query["last"]:%Y-%m}.csv"'
        )
        writer = csv.writer(response)
        by_request = "request" in query["group_by"]
        columns = [*query["group_by"], "card_hours", "cost", "currency", "energy_kwh"]
        writer.writerow([*columns, *(["nodes", "members"] if by_request else [])])
        writer.writerows(
            [row[column] for column in columns] + ([row["nodes"], _members_text(row)] if by_request else [])
            for row in rows
        )
        return response


def _members_text(row: dict) -> str:
    """A multi-node request's members in one CSV cell: "0:r1-n0 1:r1-n1"."""
    return " ".join(f"{member['member']}:{member['node']}" for member in row["members"])


class BudgetListView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("project", int)],
        responses=serializers.BudgetSerializer(many=True),
        description="This month's card-hour budget of each project you may see, with the 80% and 100% "
        "alerts raised so far.",
    )
    def get(self, request):
        query = _query(serializers.ProjectQuerySerializer, request)
        budgets = selectors.budget_list(user=request.user, project_id=query.get("project"))
        return Response(serializers.BudgetSerializer(budgets, many=True).data)


class RecommendationListView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("project", int)],
        responses=serializers.RecommendationSerializer(many=True),
        description="Rightsizing: specs that were consistently underused over the window, with the "
        "evidence and the smaller standard specs or slices that would have served.",
    )
    def get(self, request):
        query = _query(serializers.ProjectQuerySerializer, request)
        advice = [
            recommendation.as_data()
            for recommendation in selectors.recommendations(user=request.user, project_id=query.get("project"))
        ]
        return Response(serializers.RecommendationSerializer(advice, many=True).data)


class ZeroTouchView(APIView):
    @extend_schema(
        parameters=PERIOD_PARAMETERS,
        responses=serializers.ZeroTouchRowSerializer(many=True),
        description="Share of requests delivered (active at some point) without any manual operator "
        "intervention, by service and month of delivery.",
    )
    def get(self, request):
        query = _query(serializers.PeriodQuerySerializer, request)
        rows = selectors.zero_touch_kpi(user=request.user, first_month=query["first"], last_month=query["last"])
        return Response(serializers.ZeroTouchRowSerializer(rows, many=True).data)


class TokenUsageView(APIView):
    @extend_schema(
        parameters=PERIOD_PARAMETERS,
        responses=serializers.TokenUsageRowSerializer(many=True),
        description="Tokens the gateway served, by month, project and model (your projects only).",
    )
    def get(self, request):
        query = _query(serializers.PeriodQuerySerializer, request)
        rows = selectors.token_usage(user=request.user, first_month=query["first"], last_month=query["last"])
        return Response(serializers.TokenUsageRowSerializer(rows, many=True).data)


class IdleUsageView(APIView):
    @extend_schema(
        parameters=[*PERIOD_PARAMETERS, OpenApiParameter("project", int)],
        responses=serializers.IdleUsageSerializer,
        description="Card-hours held (requested) in the months, the idle card-hours among them (ended idle "
        "episodes of offerings with an idle policy) and the rest (used), per project and request you may see.",
    )
    def get(self, request):
        period = _query(serializers.PeriodQuerySerializer, request)
        project = _query(serializers.ProjectQuerySerializer, request)
        report = idle_report(
            user=request.user,
            first_month=period["first"],
            last_month=period["last"],
            project_id=project.get("project"),
        )
        return Response(serializers.IdleUsageSerializer(report).data)


def _period_and_project(request) -> dict:
    period = _query(serializers.PeriodQuerySerializer, request)
    project = _query(serializers.ProjectQuerySerializer, request)
    return {"first_month": period["first"], "last_month": period["last"], "project_id": project.get("project")}


class SlurmBooksView(APIView):
    @extend_schema(
        parameters=[*PERIOD_PARAMETERS, OpenApiParameter("project", int)],
        responses=serializers.SlurmBooksRowSerializer(many=True),
        description="For each request you may see whose work ran as Slurm jobs in the months: the card-hours Slurm's "
        "own books (slurmdbd, sacct: gres/gpu x elapsed) hold for its jobs, those the platform metered, and the "
        "difference, as last read.",
    )
    def get(self, request):
        rows = slurm_books_report(user=request.user, **_period_and_project(request))
        return Response(serializers.SlurmBooksRowSerializer(rows, many=True).data)


class ReservedIdleView(APIView):
    @extend_schema(
        parameters=[*PERIOD_PARAMETERS, OpenApiParameter("project", int)],
        responses=serializers.ReservedIdleRowSerializer(many=True),
        description="Per project you may see: the card-hours its advance reservations held in the months, and of "
        "those the hours held with nothing running (reserved but idle).",
    )
    def get(self, request):
        rows = reserved_idle_report(user=request.user, **_period_and_project(request))
        return Response(serializers.ReservedIdleRowSerializer(rows, many=True).data)
