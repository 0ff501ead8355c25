"""The cycle's milli-share placement engine kept in the scheduler process between cycles.

Building an engine scores every node of the fleet for every demand shape the cycle places (at 12,000 nodes and
~140 shapes, most of a busy cycle). A kept engine is advanced instead: the allocations that ended are given back
and the new ones taken, so each shape's index rescores only the nodes that changed since the last cycle.

That keeps a cycle's decisions those of an engine built over the cycle's snapshot *with the kept policy*. The
policy (`fgd-plus` by default) is learnt from the queue's typical shapes, whose weights move a little with every
arrival; it is learnt again when the queue's shapes have drifted more than `SCHEDULER_POLICY_DRIFT` from the ones
it was learnt from (half the summed weight differences: 0.1 means a tenth of the demand moved to other shapes).
Learning again (`PlacementEngine.relearn`) scores the shapes afresh but keeps the engine's state and what does not
depend on the policy, so the cycle decides as an engine built over its snapshot with the new policy would. The
engine is built afresh when another policy is asked for, when the inventory changed (a node or a device differs:
health, cordon, a new node), and whenever the process read the whole cluster again (`cluster_state.KeptState`: a
missed delta, the periodic compare, a test's uncommitted cycle).
"""

from django.conf import settings

from scheduling.engine import Demand, PlacementEngine, Snapshot, workload_source
from scheduling.engine.policies import learnt_shapes, shape_drift


class KeptEngine:
    def __init__(self):
        self.engine: PlacementEngine | None = None
        self._source = None  # the cluster state the engine follows: a full read of the cluster starts afresh
        self._policy = ""
        self.builds = 0  # engines built, for tests and the benchmark's report
        self.relearns = 0  # cycles that learnt the policy again on the kept engine
        self.advances = 0  # cycles that kept the engine and its policy
        self.drift = 0.0  # of the last cycle's queue from the kept policy's shapes (the benchmark reports it)

    def engine_for(self, snapshot: Snapshot, policy: str, demands: list[Demand], *, source) -> PlacementEngine:
        """An engine at `snapshot` with a policy learnt from `demands` or kept from an earlier cycle (see above).
        It is the cycle's start state: place on its forks (`CycleEngine` does)."""
        engine = self.engine
        if engine is None or not self._follows(engine, snapshot, policy, source):
            self.engine = PlacementEngine(snapshot, policy, workload=demands)
            self._source, self._policy = source, policy
            self.builds += 1
            return self.engine
        engine.advance(snapshot.allocations)
        if self._drifted(engine, policy, demands):
            engine.relearn(demands, policy)
            self.relearns += 1
        else:
            self.advances += 1
        return engine

    def _follows(self, engine, snapshot, policy: str, source) -> bool:
        """Whether the engine can be brought to `snapshot`: the same cluster state, policy and inventory."""
        if source is None or source is not self._source or policy != self._policy:
            return False
        return engine.nodes == list(snapshot.nodes)  # equal objects compare at once: a catch-up keeps unchanged ones

    def _drifted(self, engine, policy: str, demands) -> bool:
        if not demands:  # nothing to learn from: learnt from the running work, as a new engine would be
            self.drift = 1.0
            return True
        now = learnt_shapes(policy, workload_source(demands))
        self.drift = shape_drift(engine.policy.table.shapes, now)
        return self.drift > settings.SCHEDULER_POLICY_DRIFT


kept = KeptEngine()  # one per process, like cluster_state.kept: cycles run in it one at a time (the cycle lock)
