"""The scheduler end to end through PostgreSQL: one cycle over 10,000 queued requests on the openb inventory
(or, without the traces, on a synthetic inventory generated here)."""

import json
import random
import tempfile
from io import StringIO
from pathlib import Path

from django.core.management import call_command

from bench.headline import Headline
from bench.scheduler import Command as BenchScheduler

TITLE = "Scheduler cycle"
REQUESTS = 10000
OPENB_NODES = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb" / "openb_node_list_gpu_node.csv"
DESCRIPTION = (
    f"`python -m bench scheduler --requests {REQUESTS}`: the node list imported into PostgreSQL, {REQUESTS} approved "
    "requests of mixed shapes queued (1, 2, 4, 8 whole cards; half and quarter shares), then ONE scheduling cycle: "
    "advisory lock, snapshot, FGD placement with a reason for every request left waiting, bulk allocation writes, "
    "queue positions. Target: at least 500 allocations per second including the database writes, and a query "
    "count that does not grow with the number of requests."
)
TARGET = ">= 500 allocations/s with the writes; queries a cycle constant"


def synthetic_nodes(directory: Path) -> Path:
    """A deterministic 1,200-node inventory in the openb format, from models the importer knows."""
    rng = random.Random(7)
    kinds = [
        (96000, 393216, 8, "G2"),
        (64000, 262144, 2, "T4"),
        (96000, 786432, 8, "V100M32"),
        (64000, 262144, 2, "P100"),
    ]
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for n in range(1200):
        cpu, memory, gpus, model = kinds[rng.choices(range(4), weights=[5, 3, 1, 1])[0]]
        rows.append(f"syn-node-{n:04d},{cpu},{memory},{gpus},{model}")
    path = directory / "nodes.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def run_on_inventory(command: type, **options) -> list[dict]:
    """A bench command's JSON report on the openb node list, or on the synthetic one when shared/ is not beside
    the checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        nodes = OPENB_NODES if OPENB_NODES.exists() else synthetic_nodes(Path(tmp))
        out = StringIO()
        call_command(command(), nodes=nodes, as_json=True, stdout=out, **options)
    report = json.loads(out.getvalue())
    return [{"inventory": "openb (1,213 nodes, 6,212 GPUs)" if nodes == OPENB_NODES else "synthetic", **report}]


def headline(rows: list[dict]) -> Headline:
    (cycle,) = rows
    return Headline(
        f"{cycle['allocated_per_s']} allocations/s ({cycle['allocated']} of {cycle['requests']} in "
        f"{cycle['cycle_seconds']} s), {cycle['queries_per_cycle']} queries"
    )


def run() -> list[dict]:
    return run_on_inventory(BenchScheduler, requests=REQUESTS)
