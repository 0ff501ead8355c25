"""Slurm's `topology.conf` (TopologyPlugin=topology/tree) read as racks and blocks: a leaf switch (one with
`Nodes=`) is a rack, the switch above it (the one whose `Switches=` names it) is its block. Levels above a block are
the site's. Pure text in, names out; no Slurm call (slurmrestd does not serve the topology)."""

import re
from pathlib import Path

from django.conf import settings

TOPOLOGY_FILE = "topology.conf"  # Slurm reads it next to slurm.conf
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class TopologyError(ValueError):
    """The file is not a topology/tree configuration this reader understands; the message says where."""


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list syntax: "gpu[01-03,07],login1" -> gpu01, gpu02, gpu03, gpu07, login1 (zero padding kept)."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            bounds = _RANGE.match(item)
            if bounds is None:
                raise TopologyError(f"cannot read host range {item!r} in {text!r}")
            low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
            names += [f"{prefix}{n:0{len(low)}d}{suffix}" for n in range(int(low), int(high) + 1)]
    return names


def parse_topology(text: str) -> dict[str, tuple[str, str]]:
    """Node name -> (rack, block) from a topology.conf's `SwitchName=... Nodes=...` / `Switches=...` lines; a leaf
    switch under no other switch has no block ("")."""
    leaves: dict[str, list[str]] = {}
    parent: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(_pair(token, number) for token in line.split())
        switch = fields.get("switchname")
        if switch is None:
            raise TopologyError(f"line {number}: expected SwitchName=...")
        if "nodes" in fields:
            leaves[switch] = expand_hostlist(fields["nodes"])
        for child in expand_hostlist(fields.get("switches", "")) if fields.get("switches") else ():
            parent[child] = switch
    return {node: (leaf, parent.get(leaf, "")) for leaf, nodes in leaves.items() for node in nodes}


def _pair(token: str, number: int) -> tuple[str, str]:
    key, separator, value = token.partition("=")
    if not separator:
        raise TopologyError(f"line {number}: expected KEY=VALUE, not {token!r}")
    return key.lower(), value


def topology_file(path: str | Path | None = None) -> Path | None:
    """The topology.conf to read: the one given, else the one next to SLURM_CONF when it exists; None: none."""
    if path:
        return Path(path)
    if settings.SLURM_CONF:
        beside = Path(settings.SLURM_CONF).parent / TOPOLOGY_FILE
        return beside if beside.is_file() else None
    return None
