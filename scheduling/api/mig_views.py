"""MIG layout reports from node agents: per card its mode and GPU instances, as `nvidia-smi mig -lgi` / `-lci`
and `nvidia-smi -L` show them. Agents speak only for their token's nodes; operators (ingest_health) for any."""

from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.authentication import TokenAuthentication
from config.errors import DomainError
from scheduling.api.agent_auth import AgentTokenAuthentication, CanReportForNodes, sender_actor, sender_scope
from scheduling.mig import services as mig_services
from scheduling.models import Device


class MigInstanceInSerializer(serializers.Serializer):
    profile = serializers.CharField(max_length=30, help_text="e.g. 3g.40gb")
    start = serializers.IntegerField(min_value=0, max_value=15, help_text="First memory slice.")
    size = serializers.IntegerField(min_value=1, max_value=16, required=False)
    gi_id = serializers.IntegerField(min_value=0, max_value=255, required=False, allow_null=True)
    ci_id = serializers.IntegerField(min_value=0, max_value=255, required=False, allow_null=True)
    uuid = serializers.CharField(max_length=80, required=False, allow_blank=True, help_text="MIG device UUID.")


class MigDeviceReportSerializer(serializers.Serializer):
    uuid = serializers.CharField(max_length=80, help_text="The card's GPU UUID.")
    mig_mode = serializers.BooleanField()
    instances = MigInstanceInSerializer(many=True, max_length=16, required=False, default=list)


class MigLayoutReportsSerializer(serializers.Serializer):
    devices = MigDeviceReportSerializer(many=True, allow_empty=False, max_length=1000)


class MigLayoutResultsSerializer(serializers.Serializer):
    stored = serializers.ListField(child=serializers.CharField(), help_text="GPU UUIDs whose layout was stored.")
    refused = ErrorSerializer(many=True, help_text="{code, message, details: {uuid, ...}} per card not stored.")


class MigLayoutReportsView(APIView):
    """Each card is decided on its own: a refused card (unknown, another node's, impossible layout, an instance of
    running work dropped) changes nothing and never stops the others."""

    authentication_classes = [TokenAuthentication, AgentTokenAuthentication]
    permission_classes = [CanReportForNodes]

    @extend_schema(
        request=MigLayoutReportsSerializer,
        responses={200: MigLayoutResultsSerializer, **{c: OpenApiResponse(ErrorSerializer) for c in (400, 401, 403)}},
    )
    def post(self, request):
        body = MigLayoutReportsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        scope, actor = sender_scope(request), sender_actor(request)
        items = body.validated_data["devices"]
        devices = {d.uuid: d for d in Device.objects.filter(uuid__in=[i["uuid"] for i in items]).select_related("node")}
        stored, refused = [], []
        for item in items:
            device = devices.get(item["uuid"])
            if device is None:
                refused.append(
                    {"code": "unknown_device", "message": "No card has this UUID.", "details": {"uuid": item["uuid"]}}
                )
                continue
            if scope.nodes is not None and device.node_id not in scope.nodes:
                refused.append(scope.refusal({"uuid": item["uuid"], "node": device.node.name}))
                continue
            try:
                with transaction.atomic():
                    mig_services.device_mig_layout_report(
                        device=device,
                        mig_mode=item["mig_mode"],
                        instances=item["instances"],
                        source="agent report",
                        actor=actor,
                    )
            except DomainError as error:
                refused.append(
                    {"code": error.code, "message": str(error), "details": {"uuid": item["uuid"], **error.details}}
                )
                continue
            stored.append(item["uuid"])
        return Response({"stored": stored, "refused": refused})
