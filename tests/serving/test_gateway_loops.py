"""The gateway's background loops (the routes version poll, the flushes) end when it stops, whatever its Redis
client does with a cancellation."""

import asyncio
import contextlib
import faulthandler

from serving import routes
from serving.gateway import Gateway


class SwallowingRedis:
    """A Redis client whose command swallows a cancellation that lands in it, as redis-py's asyncio client can
    (redis-py#2028; against a real Redis here, 399 of 1,500 polls cancelled at random moments ran on)."""

    def __init__(self):
        self.gets = 0

    async def get(self, _key):
        self.gets += 1
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.01)
        return b"7"


async def _reload_nothing():
    """The snapshot's reload reads the database; these loops need none."""


def test_a_stop_ends_the_version_poll_even_when_a_redis_command_swallows_its_cancellation(settings):
    settings.GATEWAY_POLL_SECONDS = 0.001

    async def stop_while_polling() -> tuple[Gateway, bool]:
        gateway = Gateway()
        gateway.redis = SwallowingRedis()
        gateway._reload = _reload_nothing
        gateway.snapshot = routes.Snapshot(routes={}, keys={}, loaded_at=asyncio.get_running_loop().time())
        gateway.tasks = [asyncio.create_task(gateway._watch()), asyncio.create_task(gateway._flushing())]
        while gateway.redis.gets < 3:
            await asyncio.sleep(0.001)
        stop = asyncio.create_task(gateway._shutdown(None))
        await asyncio.wait({stop}, timeout=5)  # not cancelled if it hangs: a cancel would be swallowed too
        return gateway, stop.done()

    loop = asyncio.new_event_loop()
    try:
        gateway, stopped = loop.run_until_complete(stop_while_polling())
    finally:
        faulthandler.cancel_dump_traceback_later()  # the stop's stack watch, armed in this process
        loop.close()  # without cancelling what is left: a poll that swallows it would never end
    assert stopped and all(task.done() for task in gateway.tasks) and gateway.version == b"7"
