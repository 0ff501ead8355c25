"""Shapes of the request workflow API: the order form in; requests, approval tasks and quota changes out.

Output serializers only read. Every decision (is the order valid, does it fit, who approves) is made by the
services; the input serializers only turn ids into objects and refuse malformed JSON.
"""

from collections.abc import Mapping
from functools import cache, cached_property

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog.api.serializers import ImageSummarySerializer, NamedSummarySerializer, PricedMixin
from catalog.models import BareMetalProfile, Image, ResourceSpec, Service, ServingModel, ServingTemplate
from catalog.orderable import OrderableCatalog, orderable_catalog
from config.api import ChoiceLabelField, IdField, ModelSerializer
from requests import failures, hooks, reorder, selectors, start_words
from requests.choices import ChangeState, IfUnplaceable, OverQuota, PriorityClass, RequestState
from requests.models import (
    Approval,
    ApprovalAssignment,
    ApprovalStage,
    QuotaChangeRequest,
    RequestEvent,
    ResourceRequest,
)
from requests.orders import UNKNOWN_PROJECT, Order
from requests.quota import quota_scopes_by_project, request_quota_impact
from tenancy.api.serializers import TenantSummarySerializer
from tenancy.choices import ProjectPermission
from tenancy.models import Project
from tenancy.selectors import user_has_project_permission

# --- Input -------------------------------------------------------------------------------------------------


@extend_schema_field({"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]})
class ParameterValueField(serializers.Field):
    """An order-form value: a string, a number or a boolean. Which keys and values a service accepts is its
    parameter schema's call (catalog.parameters, applied by the order's validation with a 422)."""

    default_error_messages = {"invalid": "Must be a string, a number or a boolean."}

    def to_internal_value(self, data):
        if not isinstance(data, str | int | float | bool):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class CatalogItemField(serializers.PrimaryKeyRelatedField):
    """An id of a catalog item, looked up in the orderable catalog the order reads once (catalog.orderable), not
    queried; refused as a missing or malformed id just as a queryset lookup would refuse it."""

    def to_internal_value(self, data):
        model = self.queryset.model
        try:
            if isinstance(data, bool):
                raise TypeError
            pk = model._meta.pk.get_prep_value(data)  # what a lookup by this id would compare: int("7"), int(7.0)
        except (TypeError, ValueError):
            self.fail("incorrect_type", data_type=type(data).__name__)
        item = self.parent.catalog.get(model, pk)
        if item is None:
            self.fail("does_not_exist", pk_value=data)
        return item


class VisibleProjectField(serializers.PrimaryKeyRelatedField):
    """A project id among the projects the caller may see: one of another tenant's is refused word for word as an id
    that names no project, so the answer never confirms that it exists."""

    default_error_messages = {"does_not_exist": UNKNOWN_PROJECT}

    def __init__(self, **kwargs):
        super().__init__(queryset=Project.objects.select_related("tenant"), **kwargs)

    def to_internal_value(self, data):
        project = super().to_internal_value(data)
        user = self.context["request"].user
        if not user_has_project_permission(user=user, project=project, permission=ProjectPermission.VIEW):
            self.fail("does_not_exist", pk_value=data)
        return project


def _item(model, *, optional: bool = True) -> CatalogItemField:
    return CatalogItemField(queryset=model.objects.all(), required=not optional, allow_null=optional)


class OrderSerializer(serializers.Serializer):
    """The order form. Ids may name anything that exists: whether it can be ordered is the service's call,
    answered with a specific 422 code (spec_deprecated, image_incompatible, ...), never a bare 400."""

    service = _item(Service, optional=False)
    project = VisibleProjectField()
    spec = _item(ResourceSpec)
    image = _item(Image)
    bare_metal_profile = _item(BareMetalProfile)
    serving_model = _item(ServingModel)
    serving_template = _item(ServingTemplate)
    duration_hours = serializers.IntegerField()
    priority = serializers.ChoiceField(
        choices=PriorityClass.choices,
        default=PriorityClass.STANDARD,
        help_text="A class above the project's priority entitlement is refused (priority_not_permitted), or routed "
        "for approval as an exception with over_quota=exception.",
    )
    justification = serializers.CharField(allow_blank=True, default="", max_length=4000)
    parameters = serializers.DictField(
        child=ParameterValueField(),
        default=dict,
        help_text="The service's declared parameters (its parameter_schema), e.g. environment: production.",
    )
    over_quota = serializers.ChoiceField(
        choices=OverQuota.choices,
        default=OverQuota.REJECT,
        help_text="What to do when the order is over a quota limit or over the "
        "project's priority entitlement (wait: limits only).",
    )
    if_unplaceable = serializers.ChoiceField(
        choices=IfUnplaceable.choices,
        default=IfUnplaceable.WARN,
        help_text="When no node of the inventory could ever hold the order: refuse it (422 no_matching_spec) or "
        "submit it with a warning on its timeline.",
    )
    start_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="An advance reservation: the start of the window (it lasts duration_hours), within "
        "RESERVATION_HORIZON_DAYS. Compute orders only; on Slurm nodes whole nodes are reserved. A window whose "
        "capacity is taken is refused (409 reservation_window_taken) with the earliest start that fits.",
    )

    @cached_property
    def catalog(self) -> OrderableCatalog:
        """The catalog this order's ids are looked up in and then checked against (read once per order)."""
        return orderable_catalog()

    def order(self) -> Order:
        return Order(
            **{
                field: value
                for field, value in self.validated_data.items()
                if field not in ("over_quota", "if_unplaceable")
            },
            catalog=self.catalog,
        )


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(allow_blank=True, default="", max_length=1000)


class ExtendSerializer(serializers.Serializer):
    hours = serializers.IntegerField(min_value=1, max_value=100000)
    justification = serializers.CharField(max_length=4000)


class DecisionSerializer(serializers.Serializer):
    comment = serializers.CharField(
        allow_blank=True, default="", max_length=4000, help_text="Required to reject; the requester sees it."
    )


class BulkApproveSerializer(DecisionSerializer):
    ids = serializers.ListField(
        child=IdField(), min_length=1, max_length=200, help_text="Approval task ids from the inbox."
    )


class QuotaChangeCreateSerializer(serializers.Serializer):
    project = VisibleProjectField()
    limits = serializers.DictField(
        # The precision of the quota fields, so that an approved change can always be applied.
        child=serializers.DecimalField(max_digits=12, decimal_places=2, allow_null=True),
        help_text="New limit per quota dimension; null lifts the limit.",
    )
    justification = serializers.CharField(allow_blank=True, max_length=4000)


# --- Quota numbers -----------------------------------------------------------------------------------------


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "format": "decimal"},
            {"type": "integer"},
            {"type": "string", "enum": PriorityClass.values},
        ],
        "nullable": True,
    }
)
class QuotaNumberField(serializers.Field):
    """A quota amount as the quota module renders it: decimals as strings, counts as integers; for the priority
    entitlement, the class requested and the class allowed."""

    def to_representation(self, value):
        return value


class QuotaReasonSerializer(serializers.Serializer):
    code = serializers.CharField()
    scope = serializers.CharField(help_text="project or tenant")
    dimension = serializers.CharField()
    requested = QuotaNumberField()
    used = QuotaNumberField()
    limit = QuotaNumberField()
    allowed = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Priority classes the project may order without approval (priority reasons only).",
    )
    message = serializers.CharField()


class QuotaImpactSerializer(serializers.Serializer):
    scope = serializers.CharField(help_text="project or tenant")
    dimension = serializers.CharField()
    label = serializers.CharField()
    used = QuotaNumberField(help_text="In use now, not counting this request.")
    requested = QuotaNumberField()
    limit = QuotaNumberField(help_text="null: no limit.")
    remaining_after = QuotaNumberField()
    fits = serializers.BooleanField()
    message = serializers.CharField()


# --- Preview -----------------------------------------------------------------------------------------------


class CostSerializer(serializers.Serializer):
    hourly = serializers.DecimalField(max_digits=12, decimal_places=2)
    duration_hours = serializers.IntegerField()
    total = serializers.DecimalField(max_digits=14, decimal_places=2)
    currency = serializers.CharField()


class RouteStageSerializer(serializers.Serializer):
    order = serializers.IntegerField()
    name = serializers.CharField()
    mode = serializers.CharField()
    source = serializers.CharField()
    approvers = serializers.ListField(child=serializers.CharField(), help_text="Usernames.")
    approver_names = serializers.ListField(child=serializers.CharField(), help_text="The approvers' full names.")
    who = serializers.CharField(help_text='Who approves, in words: "Anna Approver", "any one of A and B".')
    note = serializers.CharField()


class RouteSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The policy and rule that chose the route.")
    explanation = serializers.CharField(help_text="Why it needs approval (or not), in words.")
    automatic = serializers.BooleanField(help_text="No stages: approved on submission.")
    stages = RouteStageSerializer(many=True)


class PriorityEntitlementSerializer(serializers.Serializer):
    requested = serializers.CharField()
    max_priority = serializers.CharField(help_text="The project's entitlement: the highest class without approval.")
    allowed = serializers.ListField(child=serializers.CharField())
    permitted = serializers.BooleanField(help_text="False: refused, or a quota exception with over_quota=exception.")


class DurationLimitSerializer(serializers.Serializer):
    requested = serializers.IntegerField()
    maximum = serializers.IntegerField(help_text="The smallest of the limits: the longest this order may run.")
    limits = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Maximum hours by source: service, spec, serving_template, bare_metal_profile.",
    )


class RequestPreviewSerializer(serializers.Serializer):
    summary = serializers.CharField()
    duration = DurationLimitSerializer()
    cost = CostSerializer()
    demand = serializers.DictField(help_text="What the order counts against each quota dimension.")
    quota = QuotaImpactSerializer(many=True)
    priority = PriorityEntitlementSerializer()
    fits_quota = serializers.BooleanField()
    quota_reasons = QuotaReasonSerializer(many=True)
    approval_route = RouteSerializer()
    placement = serializers.JSONField(
        allow_null=True,
        help_text="Whether it would fit now (fits_now, node, queued_ahead) or why not (code, message, "
        "details); never_fits when no node of the inventory could ever hold it. Estimated against the last "
        "scheduling cycle's outcome plus the requests queued since: as_of is that cycle's time and age_seconds its "
        "age (both null before any cycle ran, when the whole queue is placed). Null until scheduling estimates it.",
    )
    reservation = serializers.JSONField(
        allow_null=True,
        help_text="For an order with start_at: its window (start, end, hours) and its capacity (start: the earliest "
        "start at or after the asked one that fits, fits_asked, code, message); null for an order to run now.",
    )


# --- Requests ----------------------------------------------------------------------------------------------


class ProjectRefSerializer(ModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "slug", "name"]


class ServiceRefSerializer(ModelSerializer):
    class Meta:
        model = Service
        fields = ["id", "slug", "name", "kind"]


class ExpectedStartSerializer(serializers.Serializer):
    """When the request is expected to start, as the last scheduling cycle forecast it (requests/start_words.py)."""

    earliest = serializers.DateTimeField(
        allow_null=True, help_text="If work ends as early as the earliest quarter did."
    )
    likely = serializers.DateTimeField(allow_null=True, help_text="If work ends as early as ended work typically did.")
    latest = serializers.DateTimeField(allow_null=True, help_text="If everything runs to its approved end.")
    code = serializers.CharField(
        allow_null=True,
        help_text="Why there is no time (null when there is): not_timed (it waits for `reason`, not for capacity), "
        "running_without_end, beyond_forecast, no_release_fits.",
    )
    reason = serializers.CharField(allow_null=True, help_text="The wait reason of a request that is not timed.")
    message = serializers.CharField(help_text='In words, e.g. "Expected to start in about 40 min (20-70 min)."')


class QueueStatusSerializer(serializers.Serializer):
    position = serializers.IntegerField(
        source="queue_position", allow_null=True, help_text="1 is next; null until the first scheduling cycle saw it."
    )
    code = serializers.CharField(
        source="queue_reason.code",
        default=None,
        allow_null=True,
        help_text="Why it waits: quota_exhausted, no_matching_spec, capacity_in_use, backend_unavailable, ...",
    )
    message = serializers.CharField(source="queue_reason.message", default=None, allow_null=True)
    numbers = serializers.JSONField(source="queue_reason.numbers", default=None, allow_null=True)
    updated_at = serializers.DateTimeField(source="queue_updated_at", allow_null=True)
    expected_start = serializers.SerializerMethodField()

    @extend_schema_field(ExpectedStartSerializer(allow_null=True))
    def get_expected_start(self, resource_request) -> dict | None:
        return start_words.expected_start(resource_request.queue_estimate)


class _SummaryRow:
    """One request's list row from its value row (requests.selectors.SummaryRows): the keys and values
    RequestSummarySerializer renders, each formatted by that serializer's own field where formatting is more than
    the value itself (decimals, dates, the state's label)."""

    def __init__(self, summary: "RequestSummarySerializer"):
        fields = summary.fields
        self.state_label = fields["state_label"].to_representation
        self.gpu_equivalents = fields["gpu_equivalents"].to_representation
        self.cost_estimate = fields["cost_estimate"].to_representation
        self.created_at = fields["created_at"].to_representation
        self.reserved_start = fields["reserved_start"].to_representation
        self.queue_updated_at = summary._queue_serializer.fields["updated_at"].to_representation
        self.currency = summary.get_currency(None)

    def __call__(self, values: dict) -> dict:
        return {
            "id": values["id"],
            "state": values["state"],
            "state_label": self.state_label(values["state"]),
            "project": {"id": values["project_id"], "slug": values["project__slug"], "name": values["project__name"]},
            "requester": values["requester__username"],
            "service": {
                "id": values["service"].pk,
                "slug": values["service"].slug,
                "name": values["service"].name,
                "kind": values["service"].kind,
            },
            "spec": _named_object(values["spec"]),
            "bare_metal_profile": _named_object(values["bare_metal_profile"]),
            "serving_model": _named_object(values["serving_model"]),
            "duration_hours": values["duration_hours"],
            "reserved_start": self.reserved_start(values["reserved_start"]),
            "priority": values["priority"],
            "gpu_equivalents": self.gpu_equivalents(values["gpu_equivalents"]),
            "accelerator_count": values["accelerator_count"],
            "cost_estimate": self.cost_estimate(values["cost_estimate"]),
            "currency": self.currency,
            "quota_exception": values["quota_exception"],
            "created_at": self.created_at(values["created_at"]),
            "queue": self._queue(values) if values["state"] == RequestState.QUEUED else None,
        }

    def _queue(self, values: dict) -> dict:
        """QueueStatusSerializer's fields: a reason's missing key (or a reason that is not an object) reads null."""
        reason = values["queue_reason"] if isinstance(values["queue_reason"], Mapping) else {}
        code, message = reason.get("code"), reason.get("message")
        return {
            "position": values["queue_position"],
            "code": None if code is None else str(code),
            "message": None if message is None else str(message),
            "numbers": reason.get("numbers"),
            "updated_at": self.queue_updated_at(values["queue_updated_at"]),
            "expected_start": start_words.expected_start(values["queue_estimate"]),
        }


class RequestRowsSerializer(serializers.ListSerializer):
    """A list page built straight from the selector's value rows rather than by DRF's walk over each row's ~30
    fields and nested serializers (a source lookup, SkipField and None checks and a to_representation call each),
    which was most of a page's CPU. tests/requests/test_list_rows.py holds each row to the child's own output."""

    def to_representation(self, data):
        row = _SummaryRow(_formatting_summary())
        return [row(values) for values in data]


@cache
def _formatting_summary() -> "RequestSummarySerializer":
    """The summary serializer whose fields format the list rows, built once per process: a ModelSerializer builds
    its fields anew for every instance, a cost paid on every page, and these read no context and no data (DRF's settings
    and the currency are read at each call)."""
    return RequestSummarySerializer()


class RequestSummarySerializer(PricedMixin, ModelSerializer):
    """A list row: only what the list query already loaded."""

    # The docstring is the schema's description. One request (a model instance) renders through the fields below;
    # a page (many=True) takes the selector's value rows instead (RequestRowsSerializer, Meta.list_serializer_class).

    queue = serializers.SerializerMethodField(help_text="Position and reason while queued, else null.")

    state_label = ChoiceLabelField(RequestState.choices, source="state", read_only=True)
    project = ProjectRefSerializer(read_only=True)
    requester = serializers.SlugRelatedField(slug_field="username", read_only=True)
    service = ServiceRefSerializer(read_only=True)
    spec = NamedSummarySerializer(read_only=True, allow_null=True)
    bare_metal_profile = NamedSummarySerializer(read_only=True, allow_null=True)
    serving_model = NamedSummarySerializer(read_only=True, allow_null=True)

    class Meta:
        model = ResourceRequest
        fields = [
            "id",
            "state",
            "state_label",
            "project",
            "requester",
            "service",
            "spec",
            "bare_metal_profile",
            "serving_model",
            "duration_hours",
            "reserved_start",
            "priority",
            "gpu_equivalents",
            "accelerator_count",
            "cost_estimate",
            "currency",
            "quota_exception",
            "created_at",
            "queue",
        ]
        list_serializer_class = RequestRowsSerializer

    @extend_schema_field(QueueStatusSerializer(allow_null=True))
    def get_queue(self, resource_request) -> dict | None:
        if resource_request.state != RequestState.QUEUED:
            return None
        return self._queue_serializer.to_representation(resource_request)

    @cached_property
    def _queue_serializer(self) -> QueueStatusSerializer:
        # Built once per response and reused for every row: serializer construction dominates otherwise.
        return QueueStatusSerializer()


class AssignmentSerializer(ModelSerializer):
    approver = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ApprovalAssignment
        fields = ["approver", "decision", "comment", "decided_at"]


class StageSerializer(ModelSerializer):
    assignments = AssignmentSerializer(many=True, read_only=True)

    class Meta:
        model = ApprovalStage
        fields = ["order", "name", "mode", "state", "note", "decided_at", "assignments"]


class ApprovalSerializer(ModelSerializer):
    stages = StageSerializer(many=True, read_only=True)

    class Meta:
        model = Approval
        fields = ["route_name", "explanation", "summary", "state", "created_at", "decided_at", "stages"]


class EventSerializer(ModelSerializer):
    at = serializers.DateTimeField(source="created_at", read_only=True)
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = RequestEvent
        fields = ["at", "actor", "from_state", "to_state", "code", "message", "data"]


class UsageSerializer(serializers.Serializer):
    """What a request has used so far, all its allocations together, as metering counts it."""

    card_hours = serializers.DecimalField(max_digits=14, decimal_places=4)
    energy_kwh = serializers.FloatField(help_text="From the daily telemetry rollups (today's counts once rolled up).")
    prompt_tokens = serializers.IntegerField(help_text="A served model's input tokens so far (0 for compute).")
    completion_tokens = serializers.IntegerField(help_text="A served model's output tokens so far (0 for compute).")
    cost = serializers.DecimalField(max_digits=14, decimal_places=2, help_text="Cost so far.")
    cost_approved = serializers.DecimalField(
        max_digits=14, decimal_places=2, help_text="The cost approved for the request's whole duration."
    )
    currency = serializers.CharField()


class FailureSerializer(serializers.Serializer):
    """Why a failed request failed, in the requester's words (`sentence`, one per `code`: requests/failures.py), and
    what happens next."""

    code = serializers.CharField()
    sentence = serializers.CharField()
    message = serializers.CharField(help_text="The backend's own words.")
    step = serializers.CharField()
    attempts = serializers.IntegerField()
    at = serializers.DateTimeField()
    operators_told_at = serializers.DateTimeField(
        allow_null=True, help_text="When the first operator was mailed about it; null: no mail went out."
    )
    operators_can_retry = serializers.BooleanField()
    next_step = serializers.CharField()


class OrderAgainSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="The order form with the same choices filled in.")
    body = serializers.DictField(help_text="The body POST /api/v1/requests/ takes to submit the same order.")


class RequestDetailSerializer(RequestSummarySerializer):
    """Everything about one request: what was ordered, why it is where it is, and what happened."""

    tenant = TenantSummarySerializer(read_only=True)
    image = ImageSummarySerializer(read_only=True, allow_null=True)
    serving_template = NamedSummarySerializer(read_only=True, allow_null=True)
    quota_reasons = QuotaReasonSerializer(many=True, read_only=True)
    approved_spec = serializers.JSONField(read_only=True, allow_null=True)
    slurm_membership = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="A bare-metal server's Slurm membership, which says whether its tenant gets root: "
        "shared_cluster_no_root, tenant_cluster or none (the approved snapshot's once frozen); null otherwise.",
    )
    approval = serializers.SerializerMethodField()
    timeline = serializers.SerializerMethodField()
    allocation = serializers.SerializerMethodField()
    provisioning = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()
    connect_secrets = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    failure = serializers.SerializerMethodField()
    order_again = serializers.SerializerMethodField()

    class Meta(RequestSummarySerializer.Meta):
        list_serializer_class = serializers.ListSerializer  # the rows serializer knows the summary's fields only
        fields = [
            *RequestSummarySerializer.Meta.fields,
            "tenant",
            "image",
            "serving_template",
            "parameters",
            "justification",
            "hourly_cost",
            "card_hours",
            "accelerator_memory_gb",
            "cpu_cores",
            "memory_gb",
            "quota_reasons",
            "slurm_membership",
            "approved_spec",
            "approved_spec_hash",
            "approved_at",
            "updated_at",
            "approval",
            "timeline",
            "allocation",
            "provisioning",
            "endpoint",
            "connect_secrets",
            "usage",
            "queue",
            "failure",
            "order_again",
        ]

    @staticmethod
    def _written(resource_request):
        """What a submission just wrote (requests.services.Written) when this is its answer, else None."""
        return getattr(resource_request, "written", None)

    def _later(self, resource_request, hook, *args):
        """What a later stage (scheduling, provisioning, metering) has for the request; nothing yet for a request
        just submitted: those stages start after its commit."""
        return None if self._written(resource_request) else hooks.ask(hook, resource_request, *args)

    def _allocation(self, resource_request) -> dict | None:
        """The request's allocation details, asked once per response."""
        asked = self.__dict__.setdefault("_allocations", {})
        if resource_request.pk not in asked:
            asked[resource_request.pk] = self._later(resource_request, hooks.ALLOCATION_DETAILS)
        return asked[resource_request.pk]

    def _after_allocation(self, resource_request, hook, *args):
        """Provisioning runs, a serving deployment and usage exist only for a request that held an allocation (a run
        needs one, which it protects from deletion; a deployment is made by a run; usage is counted from
        allocations): a request that never held one is not asked about them."""
        if self._allocation(resource_request) is None:
            return None
        return self._later(resource_request, hook, *args)

    @extend_schema_field(ApprovalSerializer(allow_null=True))
    def get_approval(self, resource_request) -> dict | None:
        written = self._written(resource_request)
        approval = written.approval if written else selectors.approval_of(resource_request)
        return None if approval is None else ApprovalSerializer(approval).data

    @extend_schema_field(EventSerializer(many=True))
    def get_timeline(self, resource_request) -> list[dict]:
        written = self._written(resource_request)
        events = written.timeline if written else selectors.timeline_of(resource_request)
        return EventSerializer(events, many=True).data

    @extend_schema_field(FailureSerializer(allow_null=True))
    def get_failure(self, resource_request) -> dict | None:
        failure = None if self._written(resource_request) else failures.failure_of(resource_request)
        return None if failure is None else FailureSerializer(failure.as_data()).data

    @extend_schema_field(OrderAgainSerializer(allow_null=True))
    def get_order_again(self, resource_request) -> dict | None:
        http_request = self.context.get("request")
        if http_request is None or not reorder.may_order_again(http_request.user, resource_request):
            return None
        url = http_request.build_absolute_uri(reorder.form_link(resource_request))
        return OrderAgainSerializer({"url": url, "body": reorder.submit_body(resource_request)}).data

    @extend_schema_field(UsageSerializer(allow_null=True))
    def get_usage(self, resource_request) -> dict | None:
        usage = self._after_allocation(resource_request, hooks.REQUEST_USAGE)
        return None if usage is None else UsageSerializer(usage).data

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "Provisioning runs with their steps (state, attempts, duration, log excerpt, "
            "output, error); while active, what was delivered (node, devices, "
            "addresses, image, access details, start and expiry); and `waiting`, while the backend does not "
            "answer (`backend_unavailable`: whom it waits for and since when) or refused a teardown "
            "(`teardown_refused`): {code, message, details}, else null.",
        }
    )
    def get_provisioning(self, resource_request) -> dict | None:
        return self._after_allocation(resource_request, hooks.PROVISIONING_DETAILS)

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "A model-serving request's endpoint: URL, example curl, replicas with "
            "their health, tokens this month, the project's API keys.",
        }
    )
    def get_endpoint(self, resource_request) -> dict | None:
        http_request = self.context.get("request")
        base_url = http_request.build_absolute_uri("/") if http_request is not None else None
        return self._after_allocation(resource_request, hooks.ENDPOINT_DETAILS, base_url)

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "For the requester of an active request only (null for anyone else): the secrets that "
            "open its workload, by access entry, e.g. jupyter: {label, secret, access (Jupyter's URL with its "
            "token), rotated_at}. Rotate one with POST .../connect-secrets/{name}/rotate/.",
        }
    )
    def get_connect_secrets(self, resource_request) -> dict | None:
        http_request = self.context.get("request")
        viewer = getattr(http_request, "user", None)
        return self._later(resource_request, hooks.CONNECT_SECRETS, viewer)

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "Node, devices and expiry of the request's allocation, once allocated; for a "
            "model-serving request with replicas also `replicas` (each replica with its node and devices), `nodes` "
            "and `spread` (a `replicas_share_node` note when replicas had to share a node, else null).",
        }
    )
    def get_allocation(self, resource_request) -> dict | None:
        return self._allocation(resource_request)


# --- Approval tasks ----------------------------------------------------------------------------------------


class TaskStageSerializer(ModelSerializer):
    class Meta:
        model = ApprovalStage
        fields = ["order", "name", "mode", "state"]


class RequestToApproveSerializer(PricedMixin, ModelSerializer):
    """What an approver weighs: the order, its cost, and where the project's quota would stand."""

    service = ServiceRefSerializer(read_only=True)
    spec = NamedSummarySerializer(read_only=True, allow_null=True)
    bare_metal_profile = NamedSummarySerializer(read_only=True, allow_null=True)
    serving_model = NamedSummarySerializer(read_only=True, allow_null=True)
    quota_impact = serializers.SerializerMethodField()

    class Meta:
        model = ResourceRequest
        fields = [
            "id",
            "state",
            "service",
            "spec",
            "bare_metal_profile",
            "serving_model",
            "duration_hours",
            "priority",
            "cost_estimate",
            "currency",
            "quota_exception",
            "justification",
            "quota_impact",
        ]

    @extend_schema_field(QuotaImpactSerializer(many=True))
    def get_quota_impact(self, resource_request) -> list[dict]:
        scopes = self.context.get("quota_scopes", {}).get(resource_request.project_id)
        impacts = request_quota_impact(resource_request, scopes)
        return [self._impact_serializer.to_representation(impact.as_data()) for impact in impacts]

    @cached_property
    def _impact_serializer(self) -> "QuotaImpactSerializer":
        # Built once per response: constructing a serializer per row is most of an inbox page's time.
        return QuotaImpactSerializer()


class QuotaChangeSerializer(ModelSerializer):
    project = ProjectRefSerializer(read_only=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state_label = ChoiceLabelField(ChangeState.choices, source="state", read_only=True)
    limits = serializers.DictField(read_only=True, help_text="Requested limit per dimension (null: unlimited).")
    previous_limits = serializers.DictField(read_only=True, help_text="The limits when the change was asked for.")

    class Meta:
        model = QuotaChangeRequest
        fields = [
            "id",
            "project",
            "requested_by",
            "state",
            "state_label",
            "limits",
            "previous_limits",
            "justification",
            "created_at",
            "decided_at",
        ]


def _subject(task: ApprovalAssignment):
    """The approved object: attached in bulk by the inbox selector, loaded on its own for a single task."""
    return getattr(task, "subject", None) or task.stage.approval.subject


def _named_object(instance) -> dict | None:
    """NamedSummarySerializer's {id, name} of a loaded object."""
    return None if instance is None else {"id": instance.pk, "name": str(instance)}


class _TaskRow:
    """One task's inbox row: the keys and values ApprovalTaskSerializer renders, read from the task, its stage,
    approval and subject (all loaded), each formatted by the serializers' own fields where formatting is more than
    the value itself (dates, the cost). The quota impacts and a quota change render through their serializers."""

    def __init__(self, task_serializer: "ApprovalTaskSerializer"):
        fields = task_serializer.fields
        self.created_at = fields["created_at"].to_representation
        self.decided_at = fields["decided_at"].to_representation
        self.request = task_serializer._request_serializer
        self.cost_estimate = self.request.fields["cost_estimate"].to_representation
        self.currency = self.request.get_currency(None)
        self.quota_change = task_serializer._quota_change_serializer

    def __call__(self, task: ApprovalAssignment) -> dict:
        stage, approval, subject = task.stage, task.stage.approval, _subject(task)
        project = approval.project
        return {
            "id": task.pk,
            "stage": {"order": stage.order, "name": stage.name, "mode": stage.mode, "state": stage.state},
            "summary": approval.summary,
            "route": approval.route_name,
            "approval_state": approval.state,
            "requester": approval.requester.username,
            "project": None if project is None else {"id": project.pk, "slug": project.slug, "name": project.name},
            "created_at": self.created_at(approval.created_at),
            "decision": task.decision,
            "comment": task.comment,
            "decided_at": self.decided_at(task.decided_at),
            "request": self._request(subject) if isinstance(subject, ResourceRequest) else None,
            "quota_change": (
                self.quota_change.to_representation(subject) if isinstance(subject, QuotaChangeRequest) else None
            ),
        }

    def _request(self, subject: ResourceRequest) -> dict:
        """RequestToApproveSerializer's fields."""
        service = subject.service
        return {
            "id": subject.pk,
            "state": subject.state,
            "service": {"id": service.pk, "slug": service.slug, "name": service.name, "kind": service.kind},
            "spec": _named_object(subject.spec),
            "bare_metal_profile": _named_object(subject.bare_metal_profile),
            "serving_model": _named_object(subject.serving_model),
            "duration_hours": subject.duration_hours,
            "priority": subject.priority,
            "cost_estimate": self.cost_estimate(subject.cost_estimate),
            "currency": self.currency,
            "quota_exception": subject.quota_exception,
            "justification": subject.justification,
            "quota_impact": self.request.get_quota_impact(subject),
        }


class ApprovalTaskListSerializer(serializers.ListSerializer):
    """Loads the page's subjects, and quota limits and usage of their projects, in bulk rather than per row; builds
    each row directly (_TaskRow) rather than by DRF's walk over ~40 fields and nested serializers a row.
    tests/requests/test_inbox_rows.py holds the rows to ApprovalTaskSerializer's own output."""

    def to_representation(self, data):
        tasks = selectors.with_subjects(list(data))
        if not tasks:
            return []  # an empty inbox: no rows to build, no formatting fields to build for them
        projects = [subject.project for subject in map(_subject, tasks) if isinstance(subject, ResourceRequest)]
        # No request on the page (quota changes only), no quota to read: the grouped sums for no project are costly
        # to build even though PostgreSQL is never asked.
        self.context["quota_scopes"] = quota_scopes_by_project(projects) if projects else {}
        row = _TaskRow(self.child)
        return [row(task) for task in tasks]


class ApprovalTaskSerializer(ModelSerializer):
    """One decision asked of the caller, with the approval it belongs to and what is being approved."""

    stage = TaskStageSerializer(read_only=True)
    summary = serializers.CharField(source="stage.approval.summary", read_only=True)
    route = serializers.CharField(source="stage.approval.route_name", read_only=True)
    approval_state = serializers.CharField(source="stage.approval.state", read_only=True)
    requester = serializers.CharField(source="stage.approval.requester.username", read_only=True)
    project = ProjectRefSerializer(source="stage.approval.project", read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(source="stage.approval.created_at", read_only=True)
    request = serializers.SerializerMethodField()
    quota_change = serializers.SerializerMethodField()

    class Meta:
        model = ApprovalAssignment
        fields = [
            "id",
            "stage",
            "summary",
            "route",
            "approval_state",
            "requester",
            "project",
            "created_at",
            "decision",
            "comment",
            "decided_at",
            "request",
            "quota_change",
        ]
        list_serializer_class = ApprovalTaskListSerializer

    @extend_schema_field(RequestToApproveSerializer(allow_null=True))
    def get_request(self, task) -> dict | None:
        subject = _subject(task)
        if not isinstance(subject, ResourceRequest):
            return None
        return self._request_serializer.to_representation(subject)

    @extend_schema_field(QuotaChangeSerializer(allow_null=True))
    def get_quota_change(self, task) -> dict | None:
        subject = _subject(task)
        return (
            self._quota_change_serializer.to_representation(subject)
            if isinstance(subject, QuotaChangeRequest)
            else None
        )

    # Built once per response and reused for every row: serializer construction dominates otherwise.
    @cached_property
    def _request_serializer(self) -> RequestToApproveSerializer:
        return RequestToApproveSerializer(context=self.context)

    @cached_property
    def _quota_change_serializer(self) -> QuotaChangeSerializer:
        return QuotaChangeSerializer(context=self.context)


class BulkResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    ok = serializers.BooleanField()
    code = serializers.CharField(allow_null=True, help_text="Why this one was not approved.")
    message = serializers.CharField(allow_null=True)


class BulkApproveResultSerializer(serializers.Serializer):
    results = BulkResultSerializer(many=True)
