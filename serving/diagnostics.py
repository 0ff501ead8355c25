"""The gateway's diagnostics, off by default, for finding per-call work and stalls (docs/serving.md, "Profiling").

GATEWAY_PROFILE=<file>: the whole run under cProfile, its stats written to <file> on exit (`python -m pstats
<file>`). The timer is the event-loop thread's CPU time, so on a loaded machine the profile shows work, not waits
for a core; it roughly triples the CPU a call costs.

GATEWAY_STALL_LOG=<file>: what held the event loop up, written to <file> as JSON on exit: every garbage
collection's pause by generation, and each moment the loop ran over STALL_MS late (a timer that fired late:
a long callback, a GIL held by the database thread, or no core for this process), with when it happened.
"""

import asyncio
import contextlib
import gc
import json
import time
from pathlib import Path

STALL_MS = 5.0
TICK_SECONDS = 0.005


@contextlib.contextmanager
def profiled(profile_path: str, stall_log: str):
    """Yields the stall recorder (None without GATEWAY_STALL_LOG); the gateway runs its loop watcher."""
    with contextlib.ExitStack() as stack:
        stalls = stack.enter_context(_stalls_logged(Path(stall_log))) if stall_log else None
        if profile_path:
            import cProfile

            profile = cProfile.Profile(time.thread_time)
            stack.callback(profile.dump_stats, profile_path)
            stack.enter_context(profile)
        yield stalls


class Stalls:
    def __init__(self):
        self.began = time.monotonic()
        self.collections: list[tuple[float, int, float]] = []  # (seconds since start, generation, ms)
        self.late: list[tuple[float, float]] = []  # (seconds since start, ms late)
        self.collecting_since = 0.0

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.collecting_since = time.monotonic()
        else:
            ms = (time.monotonic() - self.collecting_since) * 1000
            self.collections.append((self.collecting_since - self.began, info["generation"], ms))

    async def watch_loop(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            before = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)
            late_ms = (time.monotonic() - before - TICK_SECONDS) * 1000
            if late_ms > STALL_MS:
                self.late.append((before - self.began, late_ms))

    def summary(self) -> dict:
        return {
            "gc": {
                generation: {"count": len(pauses), "max_ms": round(max(pauses, default=0.0), 3)}
                for generation in (0, 1, 2)
                for pauses in [[ms for _, gen, ms in self.collections if gen == generation]]
            },
            "gc_long": [[round(at, 2), gen, round(ms, 1)] for at, gen, ms in self.collections if ms > STALL_MS],
            "loop_late": [[round(at, 2), round(ms, 1)] for at, ms in self.late],
        }


@contextlib.contextmanager
def _stalls_logged(log: Path):
    stalls = Stalls()
    gc.callbacks.append(stalls.on_gc)
    try:
        yield stalls
    finally:
        gc.callbacks.remove(stalls.on_gc)
        log.write_text(json.dumps(stalls.summary()))
