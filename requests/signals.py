"""Signals higher apps listen to, so the request workflow never imports them."""

from django.dispatch import Signal

# Sent after commit when a request enters the queue. kwargs: request_id (int). The scheduler listens.
request_queued = Signal()

# Sent after commit when a request starts releasing. kwargs: request_id (int), reason (str). One receiver, in
# provisioning, decides how it goes (provisioning.services.release_start): what was built is torn down and the
# teardown's last step frees the devices, or nothing was built and they are freed at once. Either way the release
# ends in scheduling's allocation_free, which finishes it.
request_releasing = Signal()

# Sent after commit when a running request is preempted back to the queue. kwargs: request_id (int), winner_id (int).
# Provisioning listens to stop the environment.
request_preempted = Signal()

# Sent after commit when an extension of a request is approved. kwargs: request_id (int), extension_id (int),
# duration_hours (int: the whole term now). Provisioning listens to move the end its backend enforces (a Slurm
# job's time limit); the allocation's expiry follows the request's duration by itself.
request_extended = Signal()
