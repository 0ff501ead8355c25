"""Every write to the catalog. Admin saves and lifecycle actions come through here so each one is audited."""

from django.db import models, transaction
from django.utils import timezone

from catalog.choices import SpecStatus
from catalog.models import Image, ResourceSpec, Service, ServingModel
from config.errors import Conflict, DomainError
from tenancy.models import User
from tenancy.services import audit_record, configuration_save


def catalog_entry_save(*, entry: models.Model, changed_fields: list[str], actor: User | None) -> models.Model:
    """Validate and save a catalog entry created or edited by an operator, with an audit row."""
    return configuration_save(entry=entry, changed_fields=changed_fields, actor=actor)


def _require_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise DomainError("Give a reason; it goes on the audit record.", code="reason_required")
    return reason


@transaction.atomic
def spec_deprecate(*, spec: ResourceSpec, reason: str, actor: User | None) -> ResourceSpec:
    """Hide a spec from new orders; requests and history that reference it stay intact."""
    reason = _require_reason(reason)
    spec = ResourceSpec.objects.select_for_update().get(pk=spec.pk)
    if spec.status == SpecStatus.DEPRECATED:
        raise Conflict(f"{spec.name} is already deprecated.", code="already_deprecated")
    spec.status = SpecStatus.DEPRECATED
    spec.deprecated_at = timezone.now()
    spec.deprecation_reason = reason
    spec.save(update_fields=["status", "deprecated_at", "deprecation_reason", "updated_at"])
    audit_record(actor=actor, action="resourcespec.deprecated", target=spec, reason=reason)
    return spec


@transaction.atomic
def spec_reactivate(*, spec: ResourceSpec, reason: str, actor: User | None) -> ResourceSpec:
    reason = _require_reason(reason)
    spec = ResourceSpec.objects.select_for_update().get(pk=spec.pk)
    if spec.status == SpecStatus.ACTIVE:
        raise Conflict(f"{spec.name} is already active.", code="already_active")
    spec.status = SpecStatus.ACTIVE
    spec.deprecated_at = None
    spec.deprecation_reason = ""
    spec.save(update_fields=["status", "deprecated_at", "deprecation_reason", "updated_at"])
    audit_record(actor=actor, action="resourcespec.reactivated", target=spec, reason=reason)
    return spec


# The boolean that puts each of these in or out of the catalog.
_AVAILABILITY_FIELD = {Image: "approved", ServingModel: "approved", Service: "active"}


@transaction.atomic
def catalog_entry_set_available(
    *, entry: Image | ServingModel | Service, available: bool, reason: str, actor: User | None
) -> models.Model:
    """Approve or withdraw an image or serving model, or open or close a service."""
    reason = _require_reason(reason)
    field = _AVAILABILITY_FIELD[type(entry)]
    entry = type(entry).objects.select_for_update().get(pk=entry.pk)
    if getattr(entry, field) == available:
        return entry
    setattr(entry, field, available)
    entry.save(update_fields=[field, "updated_at"])
    verb = {
        ("approved", True): "approved",
        ("approved", False): "withdrawn",
        ("active", True): "opened",
        ("active", False): "closed",
    }[(field, available)]
    audit_record(actor=actor, action=f"{entry._meta.model_name}.{verb}", target=entry, reason=reason)
    return entry
