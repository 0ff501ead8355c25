"""The idle state of a request and the owner's snooze, in the API: GET /api/v1/requests/{id}/idle/ and
POST /api/v1/requests/{id}/idle/snooze/ ({reason}). Idle card-hours are in the usage API (GET /api/v1/usage/idle/)."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from metering.idle.selectors import idle_status
from metering.idle.services import MAX_REASON_LENGTH, idle_snooze
from requests.selectors import request_get
from tenancy.choices import TokenScope


class IdleReasonSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField()


class IdleStatusSerializer(serializers.Serializer):
    warned = serializers.BooleanField()
    idle_since = serializers.DateTimeField(allow_null=True)
    idle_seconds = serializers.IntegerField()
    warned_at = serializers.DateTimeField(allow_null=True)
    acts_at = serializers.DateTimeField(allow_null=True, help_text="When it is stopped; null: never (bare metal).")
    snoozes = serializers.IntegerField()
    snoozes_left = serializers.IntegerField()
    snoozed_until = serializers.DateTimeField(allow_null=True)
    can_snooze = serializers.BooleanField()
    reasons = IdleReasonSerializer(many=True)


class SnoozeSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=MAX_REASON_LENGTH, help_text="Why it should keep running.")


NOT_WARNED = {
    "warned": False,
    "idle_since": None,
    "idle_seconds": 0,
    "warned_at": None,
    "acts_at": None,
    "snoozes": 0,
    "snoozes_left": 0,
    "snoozed_until": None,
    "can_snooze": False,
    "reasons": [],
}


def _status_body(resource_request, user) -> dict:
    status = idle_status(resource_request, user)
    if status is None:
        return NOT_WARNED
    return {
        **{key: status[key] for key in NOT_WARNED if key in status},
        "warned": True,
        "idle_seconds": int(status["idle_for"].total_seconds()),
    }


class IdleStatusView(APIView):
    token_scope = {"GET": TokenScope.REQUESTS_READ}

    @extend_schema(
        responses={200: IdleStatusSerializer, **{code: OpenApiResponse(ErrorSerializer) for code in (401, 404)}},
        description="Where the request stands with its offering's idle policy: warned or not, idle since when, when "
        "it is stopped, snoozes used and left, and the readings behind the warning.",
    )
    def get(self, request, pk):
        return Response(IdleStatusSerializer(_status_body(request_get(user=request.user, pk=pk), request.user)).data)


class IdleSnoozeView(APIView):
    token_scope = {"POST": TokenScope.REQUESTS_WRITE}

    @extend_schema(
        request=SnoozeSerializer,
        responses={
            200: IdleStatusSerializer,
            **{code: OpenApiResponse(ErrorSerializer) for code in (400, 401, 403, 404, 409, 422)},
        },
        description="Postpone a warned request's idle stop by its offering's snooze time, with a reason (on its "
        "timeline). 409 not_warned when no stop is due, 409 snoozes_exhausted when the policy's snoozes are used; "
        "403 for people who may see the request but not release it.",
    )
    def post(self, request, pk):
        target = request_get(user=request.user, pk=pk)
        body = SnoozeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        idle_snooze(request=target, actor=request.user, reason=body.validated_data["reason"])
        return Response(IdleStatusSerializer(_status_body(target, request.user)).data)
