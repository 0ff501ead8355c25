"""The OS installer's completion callback (the one-time token is its only credential) and the operators' retry."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.errors import NotPermitted
from provisioning import services
from provisioning.models import ProvisioningRun
from provisioning.selectors import run_summary


class InstallerThrottle(AnonRateThrottle):
    rate = "120/min"


class InstallerReportSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200)
    status = serializers.ChoiceField(choices=["succeeded", "failed"])
    detail = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class InstallerCallbackView(APIView):
    """`POST` by the OS installer when it has finished: {token, status, detail}. 202, or 404 for an unknown token
    and 409 for one already used."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [InstallerThrottle]

    @extend_schema(
        request=InstallerReportSerializer,
        responses={202: None, 400: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
    )
    def post(self, request):
        report = InstallerReportSerializer(data=request.data)
        report.is_valid(raise_exception=True)
        services.installer_report(**report.validated_data)
        return Response(status=202)


class RetrySerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500)


class RunRetryView(APIView):
    """Operators: retry a failed provisioning run on the same devices from its failed step."""

    @extend_schema(
        request=RetrySerializer,
        responses={201: {"type": "object"}, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
    )
    def post(self, request, pk: int):
        if not services.can_retry(request.user):
            raise NotPermitted("Only operators can retry provisioning.")
        body = RetrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = get_object_or_404(ProvisioningRun, pk=pk)
        retry = services.run_retry(run=run, actor=request.user, reason=body.validated_data["reason"])
        return Response(run_summary(retry), status=201)
