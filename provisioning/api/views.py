"""The OS installer's side, without a session: the network boot files (served to the server waiting to install, known
by its address) and the completion callback (the run's installer token, from the node's address where known, while
the run waits for it); and the operators' retry and forced release."""

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.client_address import client_address
from config.errors import NotPermitted
from config.throttling import InstallerThrottle
from provisioning import installer_tokens, netboot, services
from provisioning.models import ProvisioningRun
from provisioning.selectors import network_install_run, run_summary


class InstallerReportSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200)
    status = serializers.ChoiceField(choices=["succeeded", "failed"])
    detail = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class InstallerCallbackView(APIView):
    """`POST` by the OS installer when it has finished: {token, status, detail}. 202; 404 for an unknown token, 403
    from an address other than the node's, 409 when the run does not wait for its installer (not booted yet, already
    reported, stopped). A refusal changes nothing."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [InstallerThrottle]

    @extend_schema(
        request=InstallerReportSerializer,
        responses={202: None, 400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
    )
    def post(self, request):
        report = InstallerReportSerializer(data=request.data)
        report.is_valid(raise_exception=True)
        services.installer_report(**report.validated_data, source_address=client_address(request) or "")
        return Response(status=202)


class _AlwaysJson(BaseContentNegotiation):
    """Boot firmware and installers ask for text; a refusal is still the platform's JSON error."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


NETBOOT_DOCUMENTS = {
    "ipxe": ("text/plain", netboot.ipxe_script),
    "user-data": ("text/cloud-config", lambda run: netboot.user_data(run, installer_tokens.installer_token(run))),
    "meta-data": ("text/plain", netboot.meta_data),
}


class NetbootView(APIView):
    """`GET` by a server booting from the network: the iPXE script of the run waiting to install it, and the
    cloud-init seed (user-data, meta-data) it points at; the server is known by its address. 404 when no server at
    the caller's address waits for a network install."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [InstallerThrottle]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = _AlwaysJson
    document = "ipxe"

    @extend_schema(responses={(200, "text/plain"): str, 404: ErrorSerializer, 409: ErrorSerializer})
    def get(self, request):
        run = network_install_run(client_address(request) or "")
        content_type, render = NETBOOT_DOCUMENTS[self.document]
        answer = HttpResponse(render(run), content_type=f"{content_type}; charset=utf-8")
        answer["Cache-Control"] = "no-store"  # the install config holds the installer's token
        return answer


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


class ForceReleaseView(APIView):
    """Operators: confirm that the workload of a release or cleanup the backend never confirmed is gone, so its
    devices go back to the pool (audited)."""

    @extend_schema(
        request=RetrySerializer,
        responses={200: {"type": "object"}, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
    )
    def post(self, request, pk: int):
        if not services.can_force_release(request.user):
            raise NotPermitted("Only operators can return the capacity of a teardown.")
        body = RetrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = get_object_or_404(ProvisioningRun, pk=pk)
        forced = services.teardown_force(run=run, actor=request.user, reason=body.validated_data["reason"])
        return Response(run_summary(forced))
