"""The opening table of docs/BENCHMARKS.md: one line per benchmark with the figure its target is about, the baseline
measured in the same run (or none, for an absolute target), the target and the date.

Each report module (bench/report/*.py, bench/faults.py) names its TARGET and reduces its rows to a Headline with
`headline(rows)`; bench/run.py runs the modules and prints and writes the table.
"""

from dataclasses import dataclass

NO_BASELINE = "none (absolute target)"


@dataclass(frozen=True)
class Headline:
    figure: str
    baseline: str = NO_BASELINE


def row_where(rows: list[dict], **match) -> dict:
    """The first row whose values include `match` (a benchmark's rows are few)."""
    return next(row for row in rows if all(row.get(key) == value for key, value in match.items()))


def table(lines: list[dict]) -> str:
    """A Markdown table of dicts that share their keys."""
    header = list(lines[0])
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(line[key]) for key in header) + " |" for line in lines]
    return "\n".join(out)
