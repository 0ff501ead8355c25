"""Signals that let higher apps react to tenancy changes without tenancy importing them."""

from django.dispatch import Signal

# Sent after commit when a project's or tenant's limits changed. kwargs: project_ids (list[int]).
quota_changed = Signal()
