"""What the idle sweep asks of the apps above metering, which it does not import."""

from django.dispatch import Signal

# Sent after commit when the sweep acts on an endpoint whose policy scales it to zero. kwargs: request_id (int),
# reason (str). Provisioning listens: it stops the replicas and returns their allocations (provisioning/scaling.py).
idle_scale_to_zero = Signal()
