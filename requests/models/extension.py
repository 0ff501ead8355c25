from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from requests.models.change import ChangeRequest


class RequestExtension(ChangeRequest):
    """More hours for a running request, approved by the same rules as a new request."""

    request = models.ForeignKey("requests.ResourceRequest", on_delete=models.CASCADE, related_name="extensions")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    hours = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    justification = models.TextField()

    class Meta(ChangeRequest.Meta):
        constraints = [
            models.CheckConstraint(condition=Q(hours__gte=1), name="extension_hours_positive"),
            models.CheckConstraint(condition=~Q(justification=""), name="extension_justified"),
            models.UniqueConstraint(
                fields=["request"], condition=Q(state="pending_approval"), name="one_pending_extension_per_request"
            ),
        ]

    def __str__(self):
        return f"Extension of #{self.request_id} by {self.hours} h"
