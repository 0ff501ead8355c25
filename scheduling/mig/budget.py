"""The partition budget: how many MIG-capable cards slices may hold at once, from the demand mix seen so far.
Pure Python.

Slices round up: a 0.47 share takes a 4g.40gb (4 of 7 compute slices, half the memory), a 0.81 share a whole card as
7g.80gb. Placed as they come, slices partition one empty card after another until the whole-card work that arrives
later finds none, although it would use a card fully (openb default: 7% of the capacity lost to whole-card pods
refused for want of an empty card). The budget shares the cards out as the demand seen so far would fill the
cluster: the demand is scaled to the cluster's cards; slices count by the GPU share they ask for (not the cards
their profiles round up to), other demands by the cards they take. What other demands that may run on MIG-capable
cards need beyond the cards that are not MIG-capable (after the demand that may run only there) is kept for them;
the rest of the MIG-capable cards is the budget. With no such demand there is no budget. Beyond it a slice goes
only to a card that already holds slices (`MigEngine.partition_budget`), or waits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.mig.model import MILLI, SliceDemand


@dataclass
class DemandMix:
    """The GPU demand seen so far over a cluster of ``capable`` MIG-capable cards (of ``capable_models``) and
    ``plain`` others: slices by the share they ask for, whole cards and time-sliced shares by the cards they take,
    split by whether they may use a MIG-capable card. All in cards."""

    capable: int
    plain: int
    capable_models: frozenset
    slices: float = 0.0
    may_use_capable: float = 0.0
    plain_only: float = 0.0

    def see(self, demand: SliceDemand, share: int) -> None:
        """One demand; ``share`` is what a slice asks for, in milli-cards (its pod's share, its profile's compute
        fraction)."""
        if demand.profile is not None:
            self.slices += demand.count * share / MILLI
        elif demand.models and not demand.models & self.capable_models:
            self.plain_only += demand.count * min(demand.share, MILLI) / MILLI
        else:
            self.may_use_capable += demand.count * min(demand.share, MILLI) / MILLI

    def see_all(self, demands: Iterable[tuple[SliceDemand, int]]) -> DemandMix:
        for demand, share in demands:
            self.see(demand, share)
        return self

    @property
    def budget(self) -> int | None:
        """The most MIG-capable cards slices may hold (None: no limit)."""
        if self.may_use_capable <= 0:
            return None
        scale = (self.capable + self.plain) / (self.slices + self.may_use_capable + self.plain_only)
        plain_left = max(0.0, self.plain - scale * self.plain_only)
        kept = max(0.0, scale * self.may_use_capable - plain_left)
        return max(0, min(self.capable, round(self.capable - kept)))
