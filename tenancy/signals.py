"""Signals that let higher apps react to tenancy changes without tenancy importing them."""

from django.dispatch import Signal

# Sent after commit when a project's or tenant's limits changed. kwargs: project_ids (list[int]).
quota_changed = Signal()

# Sent inside the transaction in which the directory took rights away from a person (tenancy.directory.rights), so
# that what waited on them (approvals) is routed again in the same transaction. kwargs: user.
directory_rights_removed = Signal()
