"""The entries of `make bench`'s table (bench/run.py): each exposes TITLE, DESCRIPTION, TARGET, run() -> list of rows
and headline(rows). What several of them share is here."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def placement_report(*arguments: str) -> dict:
    """The JSON report of `python -m bench.placement ARGUMENTS --json` (the engine harness, in a process of its own so
    that its peak memory and CPU time are its own)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.placement", *arguments, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def mean_std(stat: dict) -> str:
    """A statistic over seeds as `mean ± std`."""
    return "n/a" if stat["mean"] is None else f"{stat['mean']:.2f} ± {stat['std']:.2f}"
