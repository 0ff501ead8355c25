"""The gateway's rate limit: calls per API key and deployment per minute, counted in Redis across every gateway
process (docs/serving.md, "Rate limit").

A small limit (under 2 x LEASE_SHARE a minute) is counted call by call: each call adds 1 in Redis and waits for the
total (one round trip; the calls of one event-loop turn on one counter share one INCRBY). A large one would cost a
Redis round trip per call for nothing, so a process reserves the minute's calls in blocks (leases): INCRBY by the
block, then admits that many calls locally without asking. A block starts at 1 and doubles with use up to
limit / LEASE_SHARE, and the next one is reserved in the background when half of the current one is used, so a
busy key asks Redis once per block, not per call, and waits on it only for its first calls.

Exactness: Redis counts every reserved call and a reservation is granted only up to the limit, so all processes
together never admit more than the limit in a minute. A process may be refused while others still hold reserved,
unused calls: at most 1.5 blocks each (a block and half the one before), i.e. at most 1.5 % of the limit per other
gateway process is refused early, and what is reserved in a minute and not used is not carried over.
"""

import asyncio
import collections
import logging
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

RATE_PREFIX = "gateway:rate:"
REDIS_TIMEOUT_SECONDS = 2.0
LEASE_SHARE = 100  # a lease is at most 1/LEASE_SHARE of the limit


class Unavailable(Exception):
    """Redis did not answer: the caller is told to retry (503), never let through uncounted."""


@dataclass
class _Lease:
    left: int = 0  # calls reserved in Redis for this process and not admitted yet
    block: int = 1  # the next reservation's size
    full: bool = False  # Redis's count has reached the limit: nothing more this minute
    reserving: asyncio.Task | None = None


class RateLimiter:
    def __init__(self, redis_url: str):
        self.redis_url = redis_url
        self.counter: RedisCounter | None = None
        self.window: int | None = None
        self.leases: dict[str, _Lease] = {}

    async def connect(self) -> None:
        self.counter = await asyncio.wait_for(RedisCounter.connect(self.redis_url), REDIS_TIMEOUT_SECONDS)

    def close(self) -> None:
        if self.counter is not None:
            self.counter.close()

    async def admit(self, key_id: int, deployment_id: int, window: int, limit: int) -> bool:
        """Whether this call is within `limit` calls in minute `window` for the key and deployment."""
        counter = f"{RATE_PREFIX}{key_id}:{deployment_id}:{window}"
        largest = limit // LEASE_SHARE
        try:
            if largest <= 1:
                return await self._count(counter, 1) <= limit
            return await self._leased(counter, window, limit, largest)
        except (ConnectionError, OSError, TimeoutError):
            raise Unavailable from None

    async def _leased(self, counter: str, window: int, limit: int, largest: int) -> bool:
        if window != self.window:  # a new minute: last minute's leases are over
            self.window, self.leases = window, {}
        lease = self.leases.get(counter)
        if lease is None:
            lease = self.leases[counter] = _Lease()
        while lease.left == 0:
            if lease.full:
                return False
            if lease.reserving is None:
                self._reserve(counter, lease, limit, largest)
            await asyncio.shield(lease.reserving)  # shared by every call waiting on this lease
        lease.left -= 1
        if lease.left * 2 <= lease.block and not lease.full and lease.reserving is None:
            self._reserve(counter, lease, limit, largest)  # the next block, before this one runs out
        return True

    def _reserve(self, counter: str, lease: _Lease, limit: int, largest: int) -> None:
        async def reserve() -> None:
            try:
                amount = lease.block
                total = await self._count(counter, amount)
                lease.left += max(0, min(amount, limit - (total - amount)))
                lease.full = total >= limit
                lease.block = min(largest, amount * 2)
            finally:
                lease.reserving = None

        lease.reserving = asyncio.ensure_future(reserve())
        # A background reservation that fails is retried (and its error answered) by the next call.
        lease.reserving.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _count(self, counter: str, amount: int) -> int:
        if self.counter is None or self.counter.closed:  # Redis was away: reconnect
            await self.connect()
        return await self.counter.count(counter, amount)


class RedisCounter(asyncio.Protocol):
    """The rate-limit counters on one pipelined Redis connection. What one event-loop turn adds goes out in one
    write: per counter one INCRBY by the sum plus an EXPIRE, and each caller gets the total as of its own share
    (exact across gateway processes: Redis adds them up). Two small commands for many calls instead of a Lua script
    per call. (redis-py's asyncio client costs
    several times the CPU a call, and the gateway's CPU is the budget.) A reply that takes over REDIS_TIMEOUT_SECONDS
    closes the connection: its callers get ConnectionError (503) and the next call reconnects."""

    def __init__(self):
        self.transport = None
        # Per command sent, in order: (sent at, the futures its reply answers, what each added). An INCRBY answers
        # the callers it adds up; an EXPIRE none.
        self.waiting: collections.deque[tuple[float, list[asyncio.Future], list[int]]] = collections.deque()
        self.buffer = b""
        self.counts: dict[str, tuple[list[asyncio.Future], list[int]]] = {}  # this loop turn's calls, by counter
        self.commands: list[tuple[bytes, list[asyncio.Future], list[int]]] = []  # this loop turn's other commands
        self.watchdog: asyncio.TimerHandle | None = None

    @classmethod
    async def connect(cls, url: str) -> "RedisCounter":
        parts = urlsplit(url)
        loop = asyncio.get_running_loop()
        _transport, counter = await loop.create_connection(cls, parts.hostname or "127.0.0.1", parts.port or 6379)
        database = (parts.path or "/0").strip("/") or "0"
        if parts.password:
            await counter._send(["AUTH", *([parts.username] if parts.username else []), parts.password])
        await counter._send(["SELECT", database])
        return counter

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small writes back to back: Nagle + delayed ACK would stall each until the ACK timer
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc):
        self.transport = None
        unsent = [futures for futures, _ in self.counts.values()] + [futures for _, futures, _ in self.commands]
        for futures in [futures for _, futures, _ in self.waiting] + unsent:
            for future in futures:
                if not future.done():
                    future.set_exception(ConnectionError("Redis closed the connection"))
        self.waiting.clear()
        self.counts, self.commands = {}, []

    @property
    def closed(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def data_received(self, data: bytes):
        self.buffer += data
        while (end := self.buffer.find(b"\r\n")) >= 0:
            line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            _sent_at, futures, amounts = self.waiting.popleft()
            kind = line[:1]
            if kind == b":":
                position = int(line[1:]) - sum(amounts)
                for future, amount in zip(futures, amounts, strict=True):
                    position += amount
                    if not future.done():
                        future.set_result(position)
            elif kind == b"+":
                for future in futures:
                    future.set_result(line[1:].decode())
            else:
                for future in futures:
                    future.set_exception(ConnectionError(f"Redis: {line.decode(errors='replace')}"))

    def _send(self, words: list) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._queue()
        self.commands.append((_command(words), [future], [1]))
        return future

    def count(self, key: str, amount: int = 1) -> asyncio.Future:
        """`key`'s count once Redis has added `amount` to it (this caller's share of the turn's INCRBY last)."""
        future = asyncio.get_running_loop().create_future()
        self._queue()
        callers = self.counts.get(key)
        if callers is None:
            self.counts[key] = ([future], [amount])
        else:
            callers[0].append(future)
            callers[1].append(amount)
        return future

    def _queue(self) -> None:
        if not self.counts and not self.commands:
            asyncio.get_running_loop().call_soon(self._write)

    def _write(self):
        now = time.monotonic()
        counts, self.counts = self.counts, {}
        commands, self.commands = self.commands, []
        for key, (callers, amounts) in counts.items():
            encoded = key.encode()
            commands.append((_command([b"INCRBY", encoded, b"%d" % sum(amounts)]), callers, amounts))
            commands.append((_command([b"EXPIRE", encoded, b"120"]), [], []))
        if self.closed:
            for _, futures, _ in commands:
                for future in futures:
                    future.set_exception(ConnectionError("Redis connection closed"))
            return
        self.waiting.extend((now, futures, amounts) for _, futures, amounts in commands)
        self.transport.write(b"".join(command for command, _, _ in commands))
        if self.watchdog is None:
            self.watchdog = asyncio.get_running_loop().call_later(REDIS_TIMEOUT_SECONDS, self._check_overdue)

    def _check_overdue(self):
        self.watchdog = None
        if not self.waiting:
            return
        if time.monotonic() - self.waiting[0][0] > REDIS_TIMEOUT_SECONDS:
            logger.warning("Redis did not answer within %s s; reconnecting", REDIS_TIMEOUT_SECONDS)
            self.transport.abort()  # connection_lost fails the callers
        else:
            self.watchdog = asyncio.get_running_loop().call_later(REDIS_TIMEOUT_SECONDS / 2, self._check_overdue)

    def close(self):
        if self.watchdog is not None:
            self.watchdog.cancel()
        if self.transport is not None:
            self.transport.close()


def _command(words: list) -> bytes:
    """One command in Redis's protocol (RESP)."""
    encoded = [word if isinstance(word, bytes) else str(word).encode() for word in words]
    return b"*%d\r\n" % len(encoded) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in encoded)
