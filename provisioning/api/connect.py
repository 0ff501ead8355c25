"""The requester's connect secrets over the API: `connect_secrets` in the request's detail shows them (requester
only, requests/api/serializers.py); this rotates one."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from provisioning.connect import connect_secret_rotate, connect_secrets_shown
from requests import selectors as request_selectors


class ConnectSecretSerializer(serializers.Serializer):
    label = serializers.CharField(read_only=True)
    secret = serializers.CharField(read_only=True, help_text="The secret itself: the requester's alone.")
    access = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="The access entry with the secret in it (Jupyter: its URL with ?token=).",
    )
    rotated_at = serializers.DateTimeField(read_only=True, allow_null=True)


class ConnectSecretRotateView(APIView):
    """The requester replaces a secret of their running workload (`jupyter`: the notebook's token). The workload takes
    the new one at once; the old one, and every sign-in made with it, stops working."""

    @extend_schema(
        request=None,
        responses={
            200: ConnectSecretSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
    )
    def post(self, request, pk: int, name: str):
        resource_request = request_selectors.request_get(user=request.user, pk=pk)
        connect_secret_rotate(resource_request=resource_request, name=name, actor=request.user)
        return Response(ConnectSecretSerializer(connect_secrets_shown(resource_request, request.user)[name]).data)
