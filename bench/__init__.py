"""Benchmarks, out of the product: they import the product (and devcluster/'s local daemons); the product never
imports them (an import-linter contract in pyproject.toml, run by `make lint`).

`make bench` runs bench/run.py over the table entries of bench/report/. Each benchmark also runs alone: those
written as Django commands as `python -m bench <name> [options]` (bench/__main__.py), the others as
`python -m bench.<name>` (faults, traces, report.api_load); docs/BENCHMARKS.md.
"""

# The order caps (config/settings.py): benchmarks order many times from few seeded people into few projects, which
# the caps would refuse, so their processes run without them.
ORDER_CAP_SETTINGS = (
    "ORDER_MAX_OPEN_PER_REQUESTER",
    "ORDER_MAX_OPEN_PER_PROJECT",
    "ORDER_MAX_WAITING_PER_REQUESTER",
    "ORDER_MAX_WAITING_PER_PROJECT",
)
