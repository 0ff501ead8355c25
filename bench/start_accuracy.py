"""How good the expected starts are (issue 35): each request's estimate as the first cycle after its submission
stored it (the likely start, `queue_estimate`) against the moment a cycle actually placed it, in simulated seconds.

The error is |likely - actual| as a share of the actual wait (submission -> start), reported per wait bucket: median
and p90. Requests placed by the cycle that first saw them waited nothing and are counted apart (their estimate is that
cycle); requests that waited with no time ("unknown", with its code) are counted per code.

Requests submitted during the warm-up (`warmup_s`: the replay starts on an empty fleet with nothing ended yet, so the
forecast has no history of early ends and takes all work to its limit, as Slurm's estimate does) are reported apart
(`warmup`); the headline figures are of the steady state after it.

The replay runs cycles on a grid (`interval_s`) and gives capacity back only on it, so a request can start only at a
cycle: the estimate (the moment capacity frees, as a release-triggered cycle in production would use it) is compared
once taken to the next cycle of the grid; `raw_*` keep the comparison without that."""

import math
from datetime import datetime

from requests.models import ResourceRequest

BUCKETS = ((300, "<5 min"), (1800, "5-30 min"), (7200, "30 min-2 h"), (28800, "2-8 h"), (float("inf"), ">8 h"))


def quantile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 3)


class StartAccuracy:
    def __init__(self, start: datetime, interval_s: float, warmup_s: float = 0.0):
        self.start, self.interval_s, self.warmup_s = start, interval_s, warmup_s
        self.likely: dict[int, float | None] = {}  # request id -> the estimate's likely start (simulated s)
        self.untimed: dict[int, str] = {}  # request id -> why the estimate had no time
        self.started: dict[int, float] = {}  # request id -> its first start (simulated s)
        self.arrived: dict[int, float] = {}  # request id -> its submission, of those started (simulated s)

    def note_estimates(self, arrivals: dict[int, float], placed_now: set[int]) -> None:
        """After a cycle: the estimates of the requests that arrived before it and have none noted yet."""
        new = [pk for pk in arrivals if pk not in self.likely and pk not in placed_now]
        self.likely.update((pk, arrivals[pk]) for pk in arrivals if pk in placed_now and pk not in self.likely)
        for pk, estimate in ResourceRequest.objects.filter(pk__in=new).values_list("pk", "queue_estimate"):
            likely = (estimate or {}).get("likely")
            if likely is None:
                self.untimed[pk] = (estimate or {}).get("code") or "none"
            self.likely[pk] = None if likely is None else (datetime.fromisoformat(likely) - self.start).total_seconds()

    def note_start(self, pk: int, arrived: float, started: float) -> None:
        self.started[pk], self.arrived[pk] = started, arrived

    def report(self) -> dict:
        steady = [pk for pk in self.started if self.arrived[pk] >= self.warmup_s]
        warmup = [pk for pk in self.started if self.arrived[pk] < self.warmup_s]
        return {**self._errors(steady), "warmup": self._errors(warmup, buckets=False)}

    def _errors(self, pks: list[int], buckets: bool = True) -> dict:
        """(wait, error share on the grid, raw error share) of those that waited and had a time; the figures."""
        errors, at_once, untimed = [], 0, {}
        for pk in pks:
            wait, likely = self.started[pk] - self.arrived[pk], self.likely.get(pk)
            if wait <= 0:
                at_once += 1
            elif likely is None:
                code = self.untimed.get(pk, "none")
                untimed[code] = untimed.get(code, 0) + 1
            else:
                on_grid = math.ceil(likely / self.interval_s - 1e-9) * self.interval_s
                errors.append((wait, abs(on_grid - self.started[pk]) / wait, abs(likely - self.started[pk]) / wait))
        shares = [share for _wait, share, _raw in errors]
        raw = [share for _wait, _share, share in errors]
        figures = {
            "started_after_a_wait": len(shares),
            "started_at_once": at_once,
            "median_error_share": quantile(shares, 0.5),
            "p90_error_share": quantile(shares, 0.9),
            "raw_median_error_share": quantile(raw, 0.5),
            "raw_p90_error_share": quantile(raw, 0.9),
            "untimed_after_a_wait": untimed,
        }
        if buckets:
            figures["by_wait"] = _by_wait(errors)
        return figures


def _by_wait(errors: list[tuple[float, float, float]]) -> dict:
    buckets, low = {}, 0.0
    for high, name in BUCKETS:
        shares = [share for wait, share, _raw in errors if low < wait <= high]
        buckets[name] = {
            "n": len(shares),
            "median_error_share": quantile(shares, 0.5),
            "p90_error_share": quantile(shares, 0.9),
        }
        low = high
    return buckets
