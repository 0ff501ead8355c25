"""The order preview's placement estimate at a long queue, on the openb inventory (or the synthetic one)."""

from bench.headline import Headline
from bench.preview import Command as BenchPreview
from bench.report.scheduler import run_on_inventory

TITLE = "Order preview at a long queue"
QUEUED = 10000
DESCRIPTION = (
    f"`python -m bench preview --queued {QUEUED}`: the node list imported into PostgreSQL, {QUEUED} approved requests "
    "of mixed shapes queued, scheduling cycles until that many still wait (each leaves its outcome: free capacity per "
    "node and the head-of-line reservation), 50 more queued after them; then 200 placement estimates of orders of each "
    "shape, as the order form asks on every change. Each estimate reads the last cycle's outcome and the requests "
    "queued since, never the whole queue, and places them on a fork of the engine state the process built once for "
    "that outcome, never on the whole cluster again. An order that would wait gets its expected start 'if "
    "submitted now', replayed from the last cycle's picture with the whole queue ahead of it (seven replays: "
    "earliest, five likely draws, latest); a process replays it once per shape, term and cycle, so the first preview "
    "of each of the 6 shapes (`first_of_shape_ms`) costs the replay and the others read it. Target: p95 at most "
    "50 ms with 10,000 queued, a query count that does not grow with the queue."
)
TARGET = "p95 <= 50 ms at 10,000 queued; queries constant"


def headline(rows: list[dict]) -> Headline:
    (preview,) = rows
    return Headline(
        f"p95 {preview['p95_ms']} ms at {preview['queued']} queued (a shape's first in a cycle "
        f"{preview['first_of_shape_ms']} ms), {preview['queries']} queries"
    )


def run() -> list[dict]:
    return run_on_inventory(BenchPreview, queued=QUEUED)
