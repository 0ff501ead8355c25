"""Waiting for a local HTTP server to come up: the benchmarks and the tests start servers (gunicorn, the
model-serving gateway, inference runtimes, haproxy) as processes and wait until they answer before using them."""

import subprocess
import time

import httpx


class NotAnswering(RuntimeError):
    """The URL gave no 200 in time, or the process that was to serve it exited."""


def wait_until_answers(
    url: str, *, seconds: float = 30.0, process: subprocess.Popen | None = None, interval: float = 0.2
) -> None:
    """Return once GET `url` answers 200; raise NotAnswering after `seconds`, or as soon as `process` (the server,
    when the caller started it) has exited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise NotAnswering(f"the server of {url} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise NotAnswering(f"{url} did not answer within {seconds:g} s")
