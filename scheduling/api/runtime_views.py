"""Runtime reports from node agents: heartbeats of running workloads, and workloads that are gone."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import TokenAuthentication
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from scheduling.api.health_views import CanIngestHealth
from scheduling.reclaim import runtime_report


class RuntimeReportSerializer(serializers.Serializer):
    request = serializers.IntegerField(min_value=1, help_text="The request whose workload this is.")
    status = serializers.ChoiceField(choices=["running", "gone"])


class RuntimeReportsSerializer(serializers.Serializer):
    reports = RuntimeReportSerializer(many=True, allow_empty=False, max_length=10000)


class RuntimeReportsView(APIView):
    """Agents report workloads: `running` is a heartbeat; `gone` reclaims the allocation with that reason."""

    authentication_classes = [TokenAuthentication]
    permission_classes = [CanIngestHealth]

    @extend_schema(request=RuntimeReportsSerializer,
                   responses={200: {"type": "object", "properties": {"results": {"type": "object"}}},
                              **{code: OpenApiResponse(ErrorSerializer) for code in (400, 401, 403)}},
                   description="Per request id: heartbeat, reclaimed, or no_active_allocation.")
    def post(self, request):
        body = RuntimeReportsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        results = runtime_report(reports=[(row["request"], row["status"]) for row in body.validated_data["reports"]])
        return Response({"results": {str(request_id): outcome for request_id, outcome in results.items()}})
