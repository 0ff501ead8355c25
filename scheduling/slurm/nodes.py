"""Slurm's node objects (slurmrestd v0.0.38 `nodes`) read into inventory facts: GPUs from GRES, and whether Slurm
keeps the node out of service. Pure: no database, no HTTP."""

import re
from dataclasses import dataclass

# One GRES item, e.g. "gpu:a100:2(S:0-1)" or "mps:200": the name:type:count part and an optional "(...)" detail.
_GRES_ITEM = re.compile(r"\s*([^,(]+)(?:\([^)]*\))?\s*(?:,|$)")
# Slurm starts no work on a node in these base states, or with these flags on any base state: a node whose slurmd stops
# answering pings is NOT_RESPONDING for SlurmdTimeout before Slurm sets it DOWN, and a job placed there meanwhile
# would wait too. (The base state "unknown" of a controller just restarted, before the nodes register again, is none
# of these: it lasts seconds, and cordoning the whole pool for it would be an outage cordoning hardware.)
UNAVAILABLE_STATES = frozenset({"down", "error"})
UNAVAILABLE_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING"})


class GresError(ValueError):
    pass


@dataclass(frozen=True)
class GpuGres:
    """`count` GPUs of a Slurm GRES type; `gpu_type` is "" for an untyped `gpu:<n>`."""

    gpu_type: str
    count: int


def parse_gpus(gres: str) -> list[GpuGres]:
    """The GPUs of a node's GRES string ("gpu:a100:2,gpu:h100:1(S:0)", "gpu:4", "gpu:a100:2,mps:200"),
    in Slurm's order (which is the order of the device indexes). Other GRES (mps, shard, nic) are not devices."""
    gpus = []
    text = (gres or "").strip()
    if text in ("", "(null)", "N/A"):
        return gpus
    for match in _GRES_ITEM.finditer(text):
        item = match.group(1).strip()
        if not item:
            continue
        name, *rest = item.split(":")
        if name != "gpu":
            continue
        gpus.append(_gpu_gres(item, rest))
    return gpus


def _gpu_gres(item: str, rest: list[str]) -> GpuGres:
    if not rest:
        return GpuGres("", 1)
    if len(rest) == 1:
        # "gpu:4" is four untyped GPUs, "gpu:a100" one GPU of type a100.
        return GpuGres("", int(rest[0])) if rest[0].isdigit() else GpuGres(rest[0], 1)
    if len(rest) == 2 and rest[1].isdigit():
        return GpuGres(rest[0], int(rest[1]))
    raise GresError(f"Unreadable GPU GRES {item!r}")


@dataclass(frozen=True)
class SlurmNodeState:
    base: str  # Slurm's base state, lower case: idle, mixed, allocated, down, error, future, unknown
    flags: tuple[str, ...]  # DRAIN, FAIL, NOT_RESPONDING, MAINTENANCE, ...
    reason: str

    @classmethod
    def of(cls, node: dict) -> "SlurmNodeState":
        return cls(
            base=(node.get("state") or "unknown").lower(),
            flags=tuple(flag.upper() for flag in node.get("state_flags") or ()),
            reason=(node.get("reason") or "").strip(),
        )

    @property
    def label(self) -> str:
        """As scontrol writes it: IDLE+DRAIN, DOWN+NOT_RESPONDING."""
        return "+".join((self.base.upper(), *self.flags))

    @property
    def event_value(self) -> str:
        """What a health event records of it: IDLE+DRAIN: fan failure (the reason when Slurm gives one)."""
        return (f"{self.label}: {self.reason}" if self.reason else self.label)[:200]

    @property
    def unavailable(self) -> bool:
        """Slurm will not start work on the node (down, error, drained or draining, failing, not responding)."""
        return self.base in UNAVAILABLE_STATES or bool(UNAVAILABLE_FLAGS & set(self.flags))

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    def cordon_reason(self) -> str:
        return f"Slurm reports the node {self.label}: {self.reason or 'no reason given'}"
