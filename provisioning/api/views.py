"""The OS installer's side (its one-time token is its only credential): the network boot files and the completion
callback; and the operators' retry."""

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.errors import NotPermitted
from config.throttling import InstallerThrottle
from provisioning import netboot, services
from provisioning.models import ProvisioningRun
from provisioning.selectors import installer_run, run_summary


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


class _AlwaysJson(BaseContentNegotiation):
    """Boot firmware and installers ask for text; a refusal is still the platform's JSON error."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


NETBOOT_DOCUMENTS = {
    "ipxe": ("text/plain", netboot.ipxe_script),
    "user-data": ("text/cloud-config", netboot.user_data),
    "meta-data": ("text/plain", lambda run, _token: netboot.meta_data(run)),
}


class NetbootView(APIView):
    """`GET` by a server booting from the network: its run's iPXE script, and the cloud-init seed (user-data,
    meta-data) it points at. 404 for an unknown token, 409 once it is spent or its run has stopped."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [InstallerThrottle]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = _AlwaysJson
    document = "ipxe"

    @extend_schema(responses={(200, "text/plain"): str, 404: ErrorSerializer, 409: ErrorSerializer})
    def get(self, request, token: str):
        run = installer_run(token)
        content_type, render = NETBOOT_DOCUMENTS[self.document]
        return HttpResponse(render(run, token), content_type=f"{content_type}; charset=utf-8")


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
