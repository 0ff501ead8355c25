"""Runtime reports from node agents: heartbeats of running workloads, and workloads that are gone."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.authentication import TokenAuthentication
from scheduling import reclaim
from scheduling.api.agent_auth import AgentTokenAuthentication, CanReportForNodes, sender_scope
from scheduling.inventory.agents import NOT_YOUR_NODE

OUTCOMES = [
    reclaim.HEARTBEAT,
    reclaim.RELEASED,
    reclaim.ALREADY_RELEASING,
    reclaim.NOT_FOUND,
    reclaim.BUSY,
    NOT_YOUR_NODE,
]


class RuntimeReportSerializer(serializers.Serializer):
    request = serializers.IntegerField(min_value=1, help_text="The request whose workload this is.")
    status = serializers.ChoiceField(choices=["running", "gone"])
    sessions = serializers.IntegerField(
        min_value=0,
        max_value=100_000,
        required=False,
        help_text="SSH and Jupyter sessions open on the workload now (idle detection counts a session as activity).",
    )


class RuntimeReportsSerializer(serializers.Serializer):
    reports = RuntimeReportSerializer(many=True, allow_empty=False, max_length=10000)


class RuntimeResultsSerializer(serializers.Serializer):
    results = serializers.DictField(
        child=serializers.ChoiceField(choices=OUTCOMES), help_text="Outcome per request id."
    )
    refused = ErrorSerializer(
        many=True,
        help_text="One {code: not_your_node, message, details: {request, "
        "your_nodes}} per report about another node's allocation.",
    )


class RuntimeReportsView(APIView):
    """Agents report workloads: `running` is a heartbeat; `gone` reclaims the allocation with that reason."""

    authentication_classes = [TokenAuthentication, AgentTokenAuthentication]
    permission_classes = [CanReportForNodes]

    @extend_schema(
        request=RuntimeReportsSerializer,
        responses={
            200: RuntimeResultsSerializer,
            **{code: OpenApiResponse(ErrorSerializer) for code in (400, 401, 403)},
        },
        description="Per request id: heartbeat (running: heartbeat refreshed), released (gone: the "
        "allocation is being reclaimed), already_releasing (released or being released "
        "already), not_found (no active allocation), busy (another transaction holds it "
        "right now: nothing changed, report it again), not_your_node (the allocation is on "
        "a node this agent token does not speak for: nothing changed). Each item is "
        "decided on its own; one item never stops the others.",
    )
    def post(self, request):
        body = RuntimeReportsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        rows = body.validated_data["reports"]
        outcome = reclaim.runtime_report(
            reports=[(row["request"], row["status"]) for row in rows],
            scope=sender_scope(request),
            with_sessions=[row["request"] for row in rows if row.get("sessions")],
        )
        return Response(
            {
                "results": {str(request_id): result for request_id, result in outcome.results.items()},
                "refused": outcome.refused,
            }
        )
