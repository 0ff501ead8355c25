"""Who wants which mails, and which mails went out (so a task that runs twice sends once)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from requests.choices import NotificationKind


class NotificationPreference(models.Model):
    """A person's choice for one kind of mail; no row means the default (on)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preferences"
    )
    kind = models.CharField(max_length=32, choices=NotificationKind.choices)
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["user", "kind"]
        constraints = [
            models.UniqueConstraint(fields=["user", "kind"], name="one_notification_preference_per_kind"),
            models.CheckConstraint(condition=Q(kind__in=NotificationKind.values), name="notification_kind_valid"),
        ]

    def __str__(self):
        return f"{self.user}: {self.kind} {'on' if self.enabled else 'off'}"


class NotificationDelivery(models.Model):
    """One thing a person was told: `key` names what it was about (`event:<id>`, `assignment:<id>` for an item of
    an approval digest, `device:<id>:<isolated_at>`). Claimed before the mail goes out, in the sending transaction."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32, choices=NotificationKind.choices)
    key = models.CharField(max_length=80)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "notification deliveries"
        constraints = [
            models.UniqueConstraint(fields=["user", "kind", "key"], name="one_delivery_per_user_kind_key"),
        ]

    def __str__(self):
        return f"{self.kind} to {self.user} ({self.key})"
