from django.conf import settings
from django.db import models
from django.db.models import Q

from requests.choices import ChangeState
from requests.models.change import ChangeRequest


class QuotaChangeRequest(ChangeRequest):
    """A project lead's request for different quota limits, decided through the approval engine."""

    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="quota_change_requests")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    limits = models.JSONField(help_text="Requested limit per dimension (null lifts a limit).")
    previous_limits = models.JSONField(help_text="The limits when the change was asked for.")
    justification = models.TextField()

    class Meta(ChangeRequest.Meta):
        constraints = [
            models.CheckConstraint(condition=Q(state__in=ChangeState.values), name="quota_change_state_valid"),
            models.CheckConstraint(condition=~Q(justification=""), name="quota_change_justified"),
        ]

    def __str__(self):
        return f"Quota change #{self.pk} for {self.project.slug}"

    @property
    def changes(self) -> list[tuple[str, str | None, str | None]]:
        """(dimension, previous limit, requested limit) for each dimension asked about."""
        return [(dimension, self.previous_limits.get(dimension), value) for dimension, value in self.limits.items()]
