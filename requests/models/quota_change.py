from django.conf import settings
from django.db import models
from django.db.models import Q

from requests.choices import ChangeState
from requests.models.change import ChangeRequest
from tenancy.choices import QuotaDimension


def _plain(limit: str | None) -> str | None:
    """A stored limit ("8.00", "12000") as a person writes it ("8", "12,000" stays "12000": no grouping here)."""
    if limit is None:
        return None
    text = str(limit)
    return text.rstrip("0").rstrip(".") if "." in text else text


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
    def changes_in_words(self) -> list[tuple[str, str | None, str | None]]:
        """(dimension's label, previous limit, requested limit) as people read them: "GPUs (whole-card equivalents)",
        8 rather than 8.00; None is no limit."""
        return [
            (QuotaDimension(dimension).label, _plain(before), _plain(after))
            for dimension, before, after in self.changes
        ]

    @property
    def changes(self) -> list[tuple[str, str | None, str | None]]:
        """(dimension, previous limit, requested limit) for each dimension asked about."""
        return [(dimension, self.previous_limits.get(dimension), value) for dimension, value in self.limits.items()]
