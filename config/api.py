"""API conventions shared by every app: pagination and the one error shape {code, message, details}."""

import copy
import logging

import django_filters
from django import forms
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from config import database
from config.errors import BadRequest, DomainError, PayloadTooLarge, error_body
from config.limits import BIGINT_MAX

logger = logging.getLogger(__name__)


class ModelSerializer(serializers.ModelSerializer):
    """DRF's ModelSerializer with its fields built from the model once per class, not on every instance: mapping
    each model field to a serializer field (kinds, keyword arguments, validators) was most of the CPU of a
    request's detail, which nests half a dozen of them. Each instance still gets fresh copies of the fields, as DRF
    gives it fresh copies of its declared ones; a subclass whose fields depend on the instance or its context must
    not use this class."""

    def get_fields(self):
        built = _fields_built.get(type(self))
        if built is None:
            built = _fields_built[type(self)] = super().get_fields()
        return {name: _fresh_copy(field) for name, field in built.items()}


_fields_built: dict[type, dict] = {}


def _fresh_copy(field: serializers.Field) -> serializers.Field:
    """A copy of a field never bound, for one serializer instance to bind. A plain field's state is its arguments
    and what its constructor derived from them, none of it changed by binding or use: a shallow copy does, where
    DRF's deepcopy constructs it again (choices flattened, arguments deep-copied: most of a detail's copying). A
    field that holds fields (a nested serializer, a list of a child, a relation's many) binds them to itself when
    constructed, so it is constructed again as DRF does."""
    if isinstance(field, serializers.BaseSerializer) or hasattr(field, "child") or hasattr(field, "child_relation"):
        return copy.deepcopy(field)
    return copy.copy(field)


class StandardPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 200


class ErrorSerializer(serializers.Serializer):
    """The body of every API error; documents 4xx responses in the OpenAPI schema."""

    code = serializers.CharField(help_text="Machine-readable reason, e.g. quota_exceeded or spec_deprecated.")
    message = serializers.CharField(help_text="One human sentence.")
    details = serializers.JSONField(help_text="The numbers involved; for validation errors, messages per field.")


class IdField(serializers.IntegerField):
    """An object id in a body: a positive integer that fits the bigint primary keys."""

    def __init__(self, **kwargs):
        super().__init__(min_value=1, max_value=BIGINT_MAX, **kwargs)


class MethodResultField(serializers.CharField):
    """A string the instance's method returns (`source` names the method, e.g. `__str__`, `get_state_display`),
    called directly: DRF's generic source lookup inspects the callable's signature on every row, most of a list
    row's time."""

    def get_attribute(self, instance):
        return getattr(instance, self.source)()


class ChoiceLabelField(serializers.CharField):
    """The label of a choice field's value (source: the field), as get_<field>_display gives it, looked up in a
    dict built once rather than by Django's per-call flattening of the choices."""

    def __init__(self, choices, **kwargs):
        self.labels = {value: str(label) for value, label in choices}
        super().__init__(**kwargs)

    def to_representation(self, value):
        return self.labels.get(value, str(value))


class FilterBackend(DjangoFilterBackend):
    """django-filter's backend, but no FilterSet is built (deep-copied filters, a form, its validation: ~0.4 ms a
    call) for a query string that names none of its filters, nor suffixes one as range filters do: that FilterSet
    would keep every row."""

    def filter_queryset(self, request, queryset, view):
        filterset_class = self.get_filterset_class(view, queryset)
        names = filterset_class.base_filters if filterset_class is not None else ()
        if not any(parameter.startswith(name) for parameter in request.query_params for name in names):
            return queryset
        return super().filter_queryset(request, queryset, view)


class IdFilter(django_filters.NumberFilter):
    """An object id in a query string: a whole number within the bigint range, else a 400."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        super().__init__(*args, min_value=1, max_value=BIGINT_MAX, **kwargs)


def _first_message(detail) -> str:
    """The first human sentence inside a DRF error detail (str, list or dict)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            text = _first_message(value)
            return text if key in ("non_field_errors", "detail") else f"{key}: {text}"
        return "Invalid input."
    if isinstance(detail, list):
        return _first_message(detail[0]) if detail else "Invalid input."
    return str(detail)


def _as_domain_error(exc):
    """Django's refusals of a request it cannot read, in the error shape: too big is 413, the rest 400."""
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return PayloadTooLarge(f"The request body may be at most {limit} bytes.", details={"limit_bytes": limit})
    if isinstance(exc, SuspiciousOperation):
        return BadRequest(str(exc) or "The request could not be read.")
    return exc


def _as_drf_exception(exc):
    if isinstance(exc, Http404):
        return exceptions.NotFound()
    if isinstance(exc, PermissionDenied):
        return exceptions.PermissionDenied()
    if isinstance(exc, DjangoValidationError):
        return exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
    return exc


def exception_handler(exc, context):
    """Turn every API error into {code, message, details}; a lost database connection becomes a 503 with Retry-After
    (a read is run once more first: config.middleware); unexpected errors become a logged 500 body."""
    if database.connection_lost(exc):
        logger.warning("Database connection lost answering %s: %s", context["request"].path, exc)
        return database.mark_connection_lost(Response(database.unavailable_body(), status=503))
    exc = _as_domain_error(exc)
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status_code)
    exc = _as_drf_exception(exc)
    response = drf_exception_handler(exc, context)
    if response is None:
        logger.exception("Unhandled API error", exc_info=exc)
        return Response(
            error_body("server_error", "An unexpected error occurred; it has been logged."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    if isinstance(exc, exceptions.ValidationError):
        response.data = error_body("validation_error", _first_message(exc.detail), exc.detail)
    else:
        code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        message = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        response.data = error_body(str(code) if isinstance(code, str) else "error", str(message), _details_of(exc))
    return response


def _details_of(exc) -> dict:
    """The numbers a client acts on: how long a throttled caller waits (also in the Retry-After header), or what an
    exception carries as its `details` (the scope a token lacks)."""
    if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        return {"retry_after_seconds": int(exc.wait + 0.999)}
    return dict(getattr(exc, "details", None) or {})
