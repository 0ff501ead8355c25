"""The order preview's placement estimate at a long queue, on the openb inventory (or the synthetic one)."""

import json
import tempfile
from io import StringIO
from pathlib import Path

from django.core.management import call_command

from tests.bench.bench_scheduler import OPENB_NODES, synthetic_nodes

TITLE = "Order preview at a long queue"
QUEUED = 10000
DESCRIPTION = (
    f"`manage.py bench_preview --queued {QUEUED}`: the node list imported into PostgreSQL, {QUEUED} approved requests "
    "of mixed shapes queued, scheduling cycles until that many still wait (each leaves its outcome: free capacity per "
    "node and the head-of-line reservation), 50 more queued after them; then 200 placement estimates of orders of each "
    "shape, as the order form asks on every change. Each estimate reads the last cycle's outcome and the requests "
    "queued since, never the whole queue. Target: p95 at most 50 ms with 10,000 queued, a query count that does not "
    "grow with the queue."
)


def run() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        nodes = OPENB_NODES if OPENB_NODES.exists() else synthetic_nodes(Path(tmp))
        out = StringIO()
        call_command("bench_preview", nodes=nodes, queued=QUEUED, as_json=True, stdout=out)
    report = json.loads(out.getvalue())
    return [{"inventory": "openb (1,213 nodes, 6,212 GPUs)" if nodes == OPENB_NODES else "synthetic", **report}]
