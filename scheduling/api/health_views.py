"""Health ingestion endpoint for node agents (agent token: their nodes only) and operators' exporters (user token
of staff holding scheduling.ingest_health: any node)."""

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.authentication import TokenAuthentication
from config.parsers import JSONParser, nul_character_error
from scheduling.api import health_serializers as serializers
from scheduling.api.agent_auth import AgentTokenAuthentication, CanReportForNodes, sender_actor, sender_scope
from scheduling.inventory.health import health_ingest, parse_dcgm_text


class PrometheusTextParser(BaseParser):
    """Prometheus text exposition (`text/plain; version=0.0.4`), as dcgm-exporter serves it: the body as text."""

    media_type = "text/plain"

    def parse(self, stream, media_type=None, parser_context=None):
        # Read whole: REQUEST_MAX_BODY_BYTES (config.middleware) bounds it, and a body read only in part would
        # leave its rest to be taken for the next request on a keep-alive connection.
        raw = stream.read() if stream is not None else b""
        if b"\x00" in raw:
            raise nul_character_error("body")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise exceptions.ValidationError({"body": "Exposition text must be UTF-8."}) from exc


class HealthEventsView(APIView):
    """Health signals in; every matching signal is recorded and may degrade or isolate devices at once."""

    authentication_classes = [TokenAuthentication, AgentTokenAuthentication]
    permission_classes = [CanReportForNodes]
    parser_classes = [JSONParser, PrometheusTextParser]

    @extend_schema(
        request={
            "application/json": serializers.HealthEventsInSerializer,
            "text/plain": {"type": "string", "description": "dcgm-exporter text exposition (0.0.4)"},
        },
        responses={
            200: serializers.IngestReportSerializer,
            **{code: OpenApiResponse(ErrorSerializer) for code in (400, 401, 403)},
        },
        examples=[
            OpenApiExample(
                "BMC critical for a whole node",
                request_only=True,
                media_type="application/json",
                value={"events": [{"node": "node-1", "source": "bmc", "signal": "Status.Health", "value": "Critical"}]},
            )
        ],
        description="Structured events (JSON) or dcgm-exporter metrics (text/plain; version=0.0.4). Samples are "
        "matched against the health rules; the strongest action per device is applied (isolate beats "
        "degrade). Signals naming no known device are listed in unknown_devices. An agent token "
        "speaks for its nodes only: a signal about another node's device is refused (outcome and "
        "refused: not_your_node) and changes nothing; operators may name any node. Bad input is a 400 "
        "validation_error and changes nothing.",
    )
    def post(self, request):
        if request.content_type.split(";")[0].strip().lower() == PrometheusTextParser.media_type:
            try:
                samples = parse_dcgm_text(request.data if isinstance(request.data, str) else "")
            except ValueError as exc:
                raise exceptions.ValidationError({"body": [str(exc)]}) from exc
        else:
            body = serializers.HealthEventsInSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            samples = body.samples()
        scope = sender_scope(request)
        report = health_ingest(samples, actor=sender_actor(request), scope=scope)
        return Response(serializers.IngestReportSerializer(report, context={"scope": scope}).data)
