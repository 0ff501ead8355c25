"""Signals that scheduling sends for higher layers (the scheduling cycle, metering) to connect to.

`health_changed` is sent after the commit of a health ingestion that changed at least one device
(isolated it or changed its health). Receivers get ``device_ids`` (a list of Device primary keys) and
``isolated_ids`` (the subset that was newly isolated); they should enqueue work, not do it inline.
"""

from django.dispatch import Signal

health_changed = Signal()

# Sent after the commit of a scheduling cycle that allocated requests. kwargs: request_ids (list[int]).
# Provisioning connects here.
requests_allocated = Signal()

# Sent after every scheduling cycle that ran (held the cycle lock). kwargs: seconds (float, wall time), allocated and
# waiting (counts). Metering records the durations for /metrics.
cycle_finished = Signal()

# Sent after the commit of allocation_free, the end of every release pipeline, for the allocations it ended.
# kwargs: allocation_ids (list[int]), request_ids (list[int]). Metering refreshes their card-hours in the ledger.
allocation_ended = Signal()

# Sent after the commit of a change to whether a node should take work: a cordon or uncordon, a card isolated or its
# isolation cleared. kwargs: node_id (int), execution_backend (str), available (bool: the node may take work it could
# not take before, i.e. an uncordon or a clearance). The Slurm drain connects here, and the scheduling cycle to a
# node becoming available.
node_availability_changed = Signal()

# Sent after the commit of a change to whether an execution backend answers as a whole (BackendStatus): kwargs
# backend (str), available (bool). The cycle places again when it is back; provisioning wakes the steps waiting for
# it, and asks it again while it is not.
backend_availability_changed = Signal()

# Sent after the commit of a health ingestion with the numeric readings it carried about single devices of the
# sender's nodes (an agent's dcgm lines or JSON events). kwargs: readings ({device id: {signal: float}}), at (the
# ingestion's time). Metering keeps those of devices bound to running work as telemetry samples.
device_readings = Signal()
