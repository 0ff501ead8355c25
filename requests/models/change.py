"""What every change request shares (quota changes, extensions, isolation clearances): a decision state and when
it was taken."""

from django.db import models
from django.utils import timezone
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from requests.choices import ChangeState

C = ChangeState


class ChangeRequest(ConcurrentTransitionMixin, models.Model):
    state = FSMField(default=C.PENDING_APPROVAL, choices=ChangeState.choices, protected=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    def decide(self, approved: bool) -> None:
        """Apply or reject (the caller saves, in its transaction)."""
        (self.apply if approved else self.reject)()
        self.decided_at = timezone.now()

    @transition(field=state, source=C.PENDING_APPROVAL, target=C.APPLIED)
    def apply(self):
        pass

    @transition(field=state, source=C.PENDING_APPROVAL, target=C.REJECTED)
    def reject(self):
        pass

    @transition(field=state, source=C.PENDING_APPROVAL, target=C.CANCELLED)
    def cancel(self):
        pass
