"""Signals higher apps listen to, so the request workflow never imports them."""

from django.dispatch import Signal

# Sent after commit when a request enters the queue. kwargs: request_id (int). The scheduler listens.
request_queued = Signal()

# Sent after commit when a request starts releasing. kwargs: request_id (int), reason (str). The scheduler frees
# the devices and finishes the release.
request_releasing = Signal()
