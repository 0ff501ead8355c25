"""Request workflow endpoints. Selectors decide what the caller sees, services decide what may change."""

import django_filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter
from rest_framework.response import Response

from catalog.choices import ServiceKind
from config.api import ErrorSerializer, FilterBackend, IdFilter
from requests import approvals, extensions, quota_changes, selectors, services
from requests.api import serializers
from requests.choices import ChangeState, Decision, RequestState
from requests.models import ApprovalAssignment, QuotaChangeRequest, ResourceRequest


def _refusals(*statuses: int) -> dict:
    return {status_code: OpenApiResponse(ErrorSerializer) for status_code in statuses}


def _parsed(serializer_class, request):
    """The request body checked for shape only; malformed input is a 400 validation_error. The caller is in the
    serializer's context: a project id is looked up among the projects they may see."""
    body = serializer_class(data=request.data, context={"request": request})
    body.is_valid(raise_exception=True)
    return body


IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_MAX_LENGTH = 255


def _idempotency_key(request) -> str:
    """The order's Idempotency-Key header ("" without one), as a plain string or a structured-field string in quotes
    (draft-ietf-httpapi-idempotency-key-header); anything else is a 400 before the body is read."""
    sent = request.headers.get(IDEMPOTENCY_KEY_HEADER)
    if sent is None:
        return ""
    key = sent.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key or len(key) > IDEMPOTENCY_KEY_MAX_LENGTH or not (key.isascii() and key.isprintable()):
        raise ValidationError(
            {
                IDEMPOTENCY_KEY_HEADER: f"An idempotency key is 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} printable ASCII "
                "characters, e.g. a UUID."
            }
        )
    return key


class RequestFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=RequestState.choices)
    project = IdFilter(field_name="project_id")
    service_kind = django_filters.ChoiceFilter(field_name="service__kind", choices=ServiceKind.choices)

    class Meta:
        model = ResourceRequest
        fields = ["state", "project", "service_kind"]


class QuotaChangeFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=ChangeState.choices)
    project = IdFilter(field_name="project_id")

    class Meta:
        model = QuotaChangeRequest
        fields = ["state", "project"]


class SummaryRowsMixin:
    """A list of requests paginated as value rows, which RequestSummarySerializer's list form reads."""

    def paginate_queryset(self, queryset):
        return super().paginate_queryset(selectors.SummaryRows(queryset))


class RequestViewSet(SummaryRowsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Requests of the caller's projects and those the caller was asked to approve; order, preview, cancel."""

    filter_backends = [FilterBackend, OrderingFilter]
    filterset_class = RequestFilter
    ordering_fields = ["created_at", "cost_estimate", "id"]
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        return selectors.request_rows_visible_to(user=self.request.user)

    def get_object(self):
        return selectors.request_get(user=self.request.user, pk=self.kwargs["pk"])

    def get_serializer_class(self):
        return serializers.RequestSummarySerializer if self.action == "list" else serializers.RequestDetailSerializer

    def _detail(self, resource_request, status_code=status.HTTP_200_OK) -> Response:
        return Response(self.get_serializer(resource_request).data, status=status_code)

    @extend_schema(
        request=serializers.OrderSerializer,
        responses={201: serializers.RequestDetailSerializer, **_refusals(400, 409, 422)},
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_KEY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="Any string of up to 255 printable characters, new for each order (a UUID). Sent again "
                "with the same order, nothing new is stored: the answer is the request the first call made (201, "
                "header Idempotent-Replayed: true). Sent with another order: 422 idempotency_key_reused.",
            )
        ],
        description="Submit an order. 409 quota_exceeded lists every exceeded dimension in details.reasons and "
        "stores nothing; with over_quota=wait the request is stored as waiting_for_quota, unless it "
        "alone passes a limit (409 exceeds_limit: waiting could never admit it). An order no node of "
        "the inventory could ever hold is refused with 422 no_matching_spec (details: the blocking "
        "dimension, what is needed and the largest node) when if_unplaceable=refuse, and otherwise "
        "submitted with that warning on its timeline.",
    )
    def create(self, request):
        key = _idempotency_key(request)
        order_input = _parsed(serializers.OrderSerializer, request)
        submitted = services.request_submit(
            order=order_input.order(),
            requester=request.user,
            over_quota=order_input.validated_data["over_quota"],
            if_unplaceable=order_input.validated_data["if_unplaceable"],
            idempotency_key=key,
        )
        response = self._detail(submitted, status.HTTP_201_CREATED)
        if getattr(submitted, "resubmitted", False):
            response["Idempotent-Replayed"] = "true"
        return response

    @extend_schema(
        request=serializers.OrderSerializer,
        responses={200: serializers.RequestPreviewSerializer, **_refusals(400, 422)},
        description="What submitting this order would cost and trigger; stores nothing.",
    )
    @action(detail=False, methods=["post"])
    def preview(self, request):
        order_input = _parsed(serializers.OrderSerializer, request)
        preview = services.request_preview(
            order=order_input.order(), requester=request.user, over_quota=order_input.validated_data["over_quota"]
        )
        return Response(serializers.RequestPreviewSerializer(preview).data)

    @extend_schema(
        request=serializers.CancelSerializer,
        responses={200: serializers.RequestDetailSerializer, **_refusals(400, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        reason = _parsed(serializers.CancelSerializer, request).validated_data["reason"]
        cancelled = services.request_cancel(request=self.get_object(), actor=request.user, reason=reason)
        return self._detail(cancelled)

    @extend_schema(
        request=serializers.CancelSerializer,
        responses={200: serializers.RequestDetailSerializer, **_refusals(400, 403, 404, 409)},
        description="Release early: the devices go back to the pool and the request ends released.",
    )
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        reason = _parsed(serializers.CancelSerializer, request).validated_data["reason"] or "released early"
        released = services.request_release(request=self.get_object(), actor=request.user, reason=reason)
        return self._detail(released)

    @extend_schema(
        request=serializers.ExtendSerializer,
        responses={200: serializers.RequestDetailSerializer, **_refusals(400, 403, 404, 409, 422)},
        description="Ask for more hours for a running request: checked against the monthly card-hour "
        "budget (409 quota_exceeded) and the service's maximum (422), approved by the same "
        "rules as a new order; the allocation's expiry moves once approved.",
    )
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        body = _parsed(serializers.ExtendSerializer, request).validated_data
        extensions.request_extension_submit(
            request=self.get_object(), hours=body["hours"], justification=body["justification"], actor=request.user
        )
        return self._detail(self.get_object())


class QueueViewSet(SummaryRowsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Queued requests the caller may see, in queue order, each with its position and current reason."""

    serializer_class = serializers.RequestSummarySerializer
    filter_backends = [FilterBackend]
    filterset_class = RequestFilter

    def get_queryset(self):
        return selectors.queue_visible_to(user=self.request.user)


class ApprovalTaskViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The caller's approval tasks: the inbox of open ones, and decisions on them."""

    serializer_class = serializers.ApprovalTaskSerializer
    filter_backends = []  # the inbox is a list in approval order, not a filterable queryset
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return ApprovalAssignment.objects.none()
        return selectors.approval_inbox(user=self.request.user)  # paginated first; subjects load per page

    def get_object(self):
        return selectors.approval_task_get(user=self.request.user, pk=self.kwargs["pk"])

    def _decide(self, decision: str) -> Response:
        comment = _parsed(serializers.DecisionSerializer, self.request).validated_data["comment"]
        approvals.approval_decide(
            assignment=self.get_object(), decision=decision, comment=comment, actor=self.request.user
        )
        return Response(self.get_serializer(self.get_object()).data)  # read again: the decision changed it

    @extend_schema(
        request=serializers.DecisionSerializer,
        responses={200: serializers.ApprovalTaskSerializer, **_refusals(400, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._decide(Decision.APPROVE)

    @extend_schema(
        request=serializers.DecisionSerializer,
        responses={200: serializers.ApprovalTaskSerializer, **_refusals(400, 403, 404, 409, 422)},
        description="Reject with a comment (422 comment_required without one); the requester sees it.",
    )
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._decide(Decision.REJECT)

    @extend_schema(
        request=serializers.BulkApproveSerializer,
        responses={200: serializers.BulkApproveResultSerializer, **_refusals(400)},
        description="Approve each task on its own; one refusal does not stop the others.",
    )
    @action(detail=False, methods=["post"], url_path="bulk-approve")
    def bulk_approve(self, request):
        bulk = _parsed(serializers.BulkApproveSerializer, request)
        results = approvals.approvals_bulk_approve(
            task_ids=bulk.validated_data["ids"], comment=bulk.validated_data["comment"], actor=request.user
        )
        return Response(serializers.BulkApproveResultSerializer({"results": results}).data)


class QuotaChangeRequestViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Quota change requests of the caller's projects; project leads ask for new limits here."""

    serializer_class = serializers.QuotaChangeSerializer
    filter_backends = [DjangoFilterBackend, OrderingFilter]
    filterset_class = QuotaChangeFilter
    ordering_fields = ["created_at", "id"]
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        return selectors.quota_change_list_visible_to(user=self.request.user)

    @extend_schema(
        request=serializers.QuotaChangeCreateSerializer,
        responses={201: serializers.QuotaChangeSerializer, **_refusals(400, 403, 422)},
        description="Only the project lead may ask (403 not_project_lead); operators decide by default.",
    )
    def create(self, request):
        change_input = _parsed(serializers.QuotaChangeCreateSerializer, request)
        change = quota_changes.quota_change_request_submit(actor=request.user, **change_input.validated_data)
        return Response(self.get_serializer(change).data, status=status.HTTP_201_CREATED)
