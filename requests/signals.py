"""Signals higher apps listen to, so the request workflow never imports them."""

from django.dispatch import Signal

# Sent after commit when a request enters the queue. kwargs: request_id (int). The scheduler listens.
request_queued = Signal()

# Sent after commit when a request starts releasing. kwargs: request_id (int), reason (str). The scheduler frees
# the devices and finishes the release.
request_releasing = Signal()

# Sent after commit when a running request is preempted back to the queue. kwargs: request_id (int), winner_id (int).
# Provisioning listens to stop the environment.
request_preempted = Signal()

# Sent after commit when an extension of a running request is approved. kwargs: request_id, hours. The
# scheduler moves the allocation's expiry.
request_extended = Signal()
