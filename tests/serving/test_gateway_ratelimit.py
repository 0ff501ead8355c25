"""The gateway's rate limiter against real Redis: small limits counted call by call, large ones leased in blocks,
and across processes (two limiters on one Redis) never more than the limit, refusing early by at most the
documented tolerance."""

import asyncio
import os

import pytest

from serving.ratelimit import LEASE_SHARE, RATE_PREFIX, RateLimiter
from tests.provisioning.gateway_process import worker_redis_url

REDIS_URL = os.environ.get("RATELIMIT_TEST_REDIS_URL", worker_redis_url(13, 9))


def admitted_by_two_processes(calls_each: int, limit: int, window: int = 1000) -> tuple[int, int, list]:
    """Two limiters (as two gateway processes would hold) each take `calls_each` calls, 50 at a time (the
    benchmark's concurrency)."""

    async def run():
        first, second = RateLimiter(REDIS_URL), RateLimiter(REDIS_URL)
        await first.connect()
        await second.connect()
        admitted = [0, 0]
        try:
            for start in range(0, calls_each, 50):
                batch = min(50, calls_each - start)
                calls = [limiter.admit(1, 2, window, limit) for _ in range(batch) for limiter in (first, second)]
                results = await asyncio.gather(*calls)
                admitted[0] += sum(results[0::2])
                admitted[1] += sum(results[1::2])
            return admitted[0], admitted[1], [first, second]
        finally:
            first.close()
            second.close()

    return asyncio.run(run())


def test_a_small_limit_is_counted_call_by_call_and_exact_across_processes(redis_db):
    one, other, _ = admitted_by_two_processes(calls_each=10, limit=7)
    assert one + other == 7
    assert int(redis_db.get(f"{RATE_PREFIX}1:2:1000")) == 20  # every call counted in Redis, refused ones included
    assert 0 < redis_db.ttl(f"{RATE_PREFIX}1:2:1000") <= 120


def test_a_large_limit_is_leased_in_blocks_never_exceeded_and_refused_early_within_the_tolerance(redis_db):
    limit = 20_000
    one, other, limiters = admitted_by_two_processes(calls_each=15_000, limit=limit)
    assert one + other <= limit  # never more than the limit, however the reservations interleave
    assert one + other >= limit - 1.5 * limit / LEASE_SHARE  # at most 1.5 leases held unused by the other process
    assert one > 5_000 and other > 5_000  # both processes got their share
    reserved = int(redis_db.get(f"{RATE_PREFIX}1:2:1000"))
    assert reserved >= limit  # Redis saw the reservations, not the calls
    assert max(lease.block for limiter in limiters for lease in limiter.leases.values()) == limit // LEASE_SHARE


def test_a_new_minute_starts_a_new_count(redis_db):
    assert sum(admitted_by_two_processes(calls_each=5, limit=4, window=1000)[:2]) == 4
    assert sum(admitted_by_two_processes(calls_each=5, limit=4, window=1001)[:2]) == 4


def test_redis_away_is_unavailable_not_admitted():
    from serving.ratelimit import Unavailable

    async def run():
        limiter = RateLimiter("redis://127.0.0.1:1/0")
        with pytest.raises(Unavailable):
            await limiter.admit(1, 2, 1000, 10_000)
        with pytest.raises(Unavailable):
            await limiter.admit(1, 2, 1000, 5)

    asyncio.run(run())
