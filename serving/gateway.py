"""The gateway data plane: /serve/<deployment>/v1/... in its own asyncio process (aiohttp server, aiohttp client
to the replicas), `python manage.py run_gateway`. Run as many as the load needs behind the load balancer.

Per call, nothing touches the database:
1. the key is found by the SHA-256 of the secret in the in-process snapshot (routes.py: keys, deployments, healthy
   replicas, budgets; reloaded when the control plane bumps the version in Redis, else every
   GATEWAY_SNAPSHOT_TTL_SECONDS);
2. the rate limit is counted in Redis on a one-minute window per key and deployment (ratelimit.py): a small limit
   call by call, one round trip each; a large one in leases of up to 1 % of the limit reserved ahead, so a busy key
   does not wait on Redis per call and the processes together never exceed the limit; with no Redis it is counted
   in this process only (N gateways then allow N times the limit);
3. the token budget is checked against a counter: the ledger's month total, re-read after every flush, plus what
   this process served since;
4. round robin over the healthy replicas; one that refuses the connection is dropped from this process's rotation
   at once and reported to the control plane (deployments.replica_failed, which marks it down with the reason and
   makes every gateway reload); the call fails over to the next one;
5. a deployment scaled to zero for being idle is woken by the call (`Gateway._awake`): the control plane is asked
   for a replica once, and the call is held until one serves, for at most GATEWAY_WAKE_SECONDS (else 503
   waking_up with a Retry-After);
6. the answer is relayed (server-sent events line by line, as they come) and its `usage` added to an in-memory
   tally, flushed to metering.TokenUsage at least every second and on SIGTERM. A crash loses at most the last
   second of counts. A streamed answer without `usage` (llama.cpp's) is counted here: see `_StreamCount`.

Errors are {code, message, details}: 400 invalid_path (a path that would leave the replica's /v1/: paths.py),
401 invalid_api_key, 403 key_not_for_this_deployment, 404 unknown_deployment, 429 rate_limited (Retry-After) /
token_budget_exhausted, 409 quota_exceeded (waking it would exceed the project's quota), 503 waking_up,
502 no_healthy_replica / upstream_unavailable, 504 upstream_timeout.
"""

import asyncio
import contextlib
import faulthandler
import gc
import hashlib
import itertools
import json
import logging
import math
import os
import signal
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import aiohttp
from aiohttp import web
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone
from yarl import URL

from config.errors import DomainError
from serving import diagnostics, paths, ratelimit, routes, usage
from serving.choices import DeploymentState

logger = logging.getLogger(__name__)

FORWARDED_HEADERS = ("Content-Type", "Accept")
LAST_USE_EVERY_SECONDS = 60.0
WAKE_RETRY_AFTER_SECONDS = 5  # a replica of a small model starts in seconds
SAFETY_RELOAD_SECONDS = 5.0


class Refusal(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict | None = None, **details):
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.details = status, code, message, headers or {}, details

    def response(self) -> web.Response:
        body = json.dumps({"code": self.code, "message": self.message, "details": self.details})
        return web.Response(text=body, status=self.status, content_type="application/json", headers=self.headers)


def _replica_path(request: web.Request) -> str:
    """The call's path under the replica's /v1/, as the caller encoded it (aiohttp's match_info is decoded: `%2e%2e`
    there is `..`); a path that would leave /v1/ is refused before anything else (paths.py)."""
    try:
        return paths.replica_path(paths.raw_remainder(request.raw_path) or "")  # the request target as sent
    except paths.PathRefused as refused:
        raise Refusal(refused.status_code, refused.code, refused.message, **refused.details) from None


class _StreamCount:
    """The completion tokens of a streamed answer that reports no `usage` (llama.cpp's server never does): its
    content deltas. llama.cpp's server sends one event per sampled token (it holds text back only while it could
    still be a stop string or an incomplete UTF-8 character), so the events are the sampled tokens, with no second
    pass; re-tokenizing the assembled text would cost a call per answer and can disagree with what was sampled.
    The prompt's tokens are asked of the replica's tokenizer (Gateway._prompt_tokens). docs/serving.md, "Streaming
    usage"."""

    __slots__ = ("completion",)

    def __init__(self):
        self.completion = 0

    def add(self, event: dict) -> None:
        for choice in event.get("choices") or ():
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if text:
                self.completion += 1


class Gateway:
    def __init__(self, *, redis_url: str = "", stalls: diagnostics.Stalls | None = None):
        self.redis_url = redis_url
        self.stalls = stalls
        self.redis = None
        self.limiter = ratelimit.RateLimiter(redis_url) if redis_url else None
        self.snapshot = routes.Snapshot(routes={}, keys={}, loaded_at=0.0)
        # Replicas this process found dead -> when the control plane recorded it (None: not yet). A snapshot read
        # before that moment still lists them healthy, so a reload keeps them out of the rotation until then.
        self.found_down: dict[int, float | None] = {}
        self.version = None
        self.turns = itertools.count()
        self.db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-db")
        self.local_rates: dict[str, int] = {}
        self.tally: dict[tuple, list] = {}
        self.db_tokens: dict[int, int] = {}  # this month's ledger total per request, as of the last flush
        self.local_tokens: dict[int, int] = defaultdict(int)  # served by this process, not in db_tokens yet
        self.last_use: dict[str, float] = {}
        self.last_use_written: dict[str, float] = {}
        self.session: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task] = []  # the loops: the snapshot's watch, the flushes (and the stall watch)
        self.stopping = asyncio.Event()  # set when the gateway stops: the loops end at their next turn
        self.counting: set[asyncio.Task] = set()  # streamed answers whose prompt tokens are being counted
        self.waking: dict[str, asyncio.Task] = {}  # deployments at zero this process asked to wake, by slug
        self.today, self.today_until = None, 0.0
        timeout = settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=2.0, sock_read=timeout)

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=settings.REQUEST_MAX_BODY_BYTES)
        app.router.add_route("*", "/serve/{slug}/v1/{path:.*}", self.serve)
        app.router.add_get("/healthz", self.healthz)
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._shutdown)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _start(self, _app) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0, keepalive_timeout=30),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # replicas set no cookies; no jar to filter per call
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            timeout=self.timeout,
        )
        if self.redis_url:
            import redis.asyncio

            self.redis = redis.asyncio.Redis.from_url(self.redis_url, socket_timeout=2)  # the version poll
            with contextlib.suppress(OSError):  # Redis down at start: calls answer 503 until it is back
                await self.limiter.connect()
        await self._reload()
        # Django, aiohttp and the snapshot are ~100,000 objects that live as long as the process: a full collection
        # walked them all with the event loop stopped, again and again under load, and those pauses were the paced
        # benchmark's p99 (GATEWAY_GC_LOG). Frozen, the collector only walks what calls allocate.
        gc.collect()
        gc.freeze()
        self.tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._flushing())]
        if self.stalls is not None:
            self.tasks.append(asyncio.create_task(self.stalls.watch_loop(self.stopping)))

    async def _shutdown(self, _app) -> None:
        # A stop takes the shutdown wait at most twice for calls in flight (to finish, then once cancelled), once for
        # streamed answers' counts, and much less for the last flush. One that outlasts four prints every thread's
        # stack to the log, so a stop that hangs (on a database lock, say) says where before the supervisor kills it.
        # The watch is left running to the process's end: a hang after the cleanup (a thread that exit joins) shows
        # too.
        faulthandler.dump_traceback_later(max(4 * settings.GATEWAY_SHUTDOWN_SECONDS, 1.0))  # 0 s waits: at 1 s
        logger.info("Gateway stopping; %d tallies to flush", len(self.tally))
        # The loops are told to end, not cancelled. redis-py can swallow a cancellation in a command (redis-py#2028):
        # the version poll then ran on and the stop waited for it forever. And a flush cancelled while the database
        # thread ran it put its tallies back for the last flush to write a second time.
        self.stopping.set()
        await asyncio.gather(*self.tasks)

    async def _cleanup(self, _app) -> None:
        """After the in-flight calls ended: the last tallies go to the ledger, so a clean stop loses nothing."""
        if self.counting:
            await asyncio.wait(set(self.counting), timeout=settings.GATEWAY_SHUTDOWN_SECONDS)
        await self._flush()
        await self.session.close()
        if self.redis is not None:
            await self.redis.aclose()
            self.limiter.close()
        await asyncio.get_running_loop().run_in_executor(self.db, close_old_connections)
        self.db.shutdown(wait=True)
        logger.info("Gateway stopped; its tallies are in the ledger")

    async def _in_db(self, function, *args):
        def run():
            close_old_connections()
            return function(*args)

        return await asyncio.get_running_loop().run_in_executor(self.db, run)

    async def _reload(self) -> None:
        started = time.monotonic()
        snapshot = await self._in_db(routes.snapshot_load)
        for route in snapshot.routes.values():
            route.replicas = [r for r in route.replicas if not self._still_down(r.id, started)]
        self.found_down = {i: at for i, at in self.found_down.items() if at is None or at > started}
        self.snapshot = snapshot
        budgeted = [r.request_id for r in self.snapshot.routes.values() if r.monthly_token_budget is not None]
        if budgeted:
            totals = await self._in_db(usage.tokens_this_month_by_request, budgeted)
            self.db_tokens.update({request_id: totals.get(request_id, 0) for request_id in budgeted})

    async def _running_after(self, seconds: float) -> bool:
        """Wait `seconds`, less if the gateway starts stopping; whether it is still running."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return not self.stopping.is_set()

    async def _watch(self) -> None:
        """Reload the snapshot when the control plane's version moves (Redis), else on a short TTL."""
        every = settings.GATEWAY_POLL_SECONDS if self.redis is not None else settings.GATEWAY_SNAPSHOT_TTL_SECONDS
        while await self._running_after(every):
            try:
                if self.redis is None or await self._routes_moved():
                    await self._reload()
            except Exception:
                logger.exception("Gateway snapshot reload failed; serving the previous one")
                await self._running_after(1.0)

    async def _routes_moved(self) -> bool:
        """The control plane's routes version moved since the last look, or the snapshot is due a safety reload."""
        version = await self.redis.get(routes.ROUTES_VERSION_KEY)
        moved = version != self.version or time.monotonic() - self.snapshot.loaded_at > SAFETY_RELOAD_SECONDS
        self.version = version
        return moved

    async def _flushing(self) -> None:
        while await self._running_after(settings.GATEWAY_FLUSH_SECONDS):
            try:
                await self._flush()
            except Exception:
                logger.exception("Gateway metering flush failed; keeping the tallies for the next one")

    async def _flush(self) -> None:
        tally, self.tally = self.tally, {}
        tallies = [
            usage.Tally(request_id, project_id, model, prefix, day, n, prompt, completion)
            for (request_id, prefix, day), (project_id, model, n, prompt, completion) in tally.items()
        ]
        try:
            await self._in_db(usage.tokens_flush, tallies)
        except BaseException:
            for key, row in tally.items():  # back into the tally: the next flush tries again
                mine = self.tally.setdefault(key, [row[0], row[1], 0, 0, 0])
                for i in (2, 3, 4):
                    mine[i] += row[i]
            raise
        flushed = defaultdict(int)
        for t in tallies:
            flushed[t.request_id] += t.prompt + t.completion
        budgeted = [r.request_id for r in self.snapshot.routes.values() if r.monthly_token_budget is not None]
        totals = await self._in_db(usage.tokens_this_month_by_request, budgeted) if budgeted else {}
        for request_id, tokens in flushed.items():
            self.local_tokens[request_id] -= tokens
        self.db_tokens.update({request_id: totals.get(request_id, 0) for request_id in budgeted})  # a new month: 0
        await self._note_last_use()

    async def _note_last_use(self) -> None:
        now = time.time()
        due = {
            prefix: at
            for prefix, at in self.last_use.items()
            if at - self.last_use_written.get(prefix, 0.0) >= LAST_USE_EVERY_SECONDS
        }
        if due:
            from serving.keys import api_keys_used

            await self._in_db(api_keys_used, due)
            self.last_use_written.update(dict.fromkeys(due, now))

    # --- one call ------------------------------------------------------------------------------------------------

    async def healthz(self, _request) -> web.Response:
        return web.json_response({"status": "ok", "routes": len(self.snapshot.routes)})

    async def serve(self, request: web.Request) -> web.StreamResponse:
        try:
            request["replica_path"] = _replica_path(request)
            key, route = self._admit(request)
            await self._check_rate(key, route)
            self._check_budget(route)
            if route.asleep:
                route = await self._awake(route)
            return await self._forward(request, key, route)
        except Refusal as refusal:
            return refusal.response()

    def _admit(self, request: web.Request) -> tuple[routes.Key, routes.Route]:
        secret = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        key = (
            self.snapshot.keys.get(hashlib.sha256(secret.encode(errors="surrogatepass")).hexdigest())
            if secret
            else None
        )
        if key is None or (key.expires_at is not None and key.expires_at <= time.time()):
            raise Refusal(401, "invalid_api_key", "Send a valid, unrevoked project API key as 'Authorization: Bearer'.")
        slug = request.match_info["slug"]
        route = self.snapshot.routes.get(slug)
        if route is None:
            raise Refusal(404, "unknown_deployment", f"No deployment '{slug}' is serving.")
        if key.project_id != route.project_id:
            raise Refusal(403, "key_not_for_this_deployment", "This key belongs to another project.")
        return key, route

    async def _check_rate(self, key: routes.Key, route: routes.Route) -> None:
        now = time.time()
        window = int(now // 60)
        if self.limiter is not None:
            try:
                admitted = await self.limiter.admit(key.id, route.deployment_id, window, route.rate_limit_per_minute)
            except ratelimit.Unavailable:
                raise Refusal(
                    503, "rate_limiter_unavailable", "The rate limiter (Redis) did not answer; try again shortly."
                ) from None
        else:
            counter = f"{key.id}:{route.deployment_id}:{window}"
            count = self.local_rates.get(counter, 0) + 1
            if count == 1:
                self.local_rates = {k: v for k, v in self.local_rates.items() if k.endswith(f":{window}")}
            self.local_rates[counter] = count
            admitted = count <= route.rate_limit_per_minute
        if not admitted:
            retry_after = max(1, math.ceil((window + 1) * 60 - now))
            raise Refusal(
                429,
                "rate_limited",
                f"More than {route.rate_limit_per_minute} requests a minute with this key.",
                headers={"Retry-After": str(retry_after)},
                limit=route.rate_limit_per_minute,
                retry_after=retry_after,
            )

    def _check_budget(self, route: routes.Route) -> None:
        if route.monthly_token_budget is None:
            return
        used = self.db_tokens.get(route.request_id, 0) + self.local_tokens.get(route.request_id, 0)
        if used >= route.monthly_token_budget:
            raise Refusal(
                429,
                "token_budget_exhausted",
                f"The deployment's monthly token budget ({route.monthly_token_budget}) is used up; "
                "it renews on the 1st.",
                budget=route.monthly_token_budget,
                used=used,
            )

    async def _forward(self, request: web.Request, key: routes.Key, route: routes.Route) -> web.StreamResponse:
        replicas = route.replicas
        if not replicas:
            raise Refusal(
                502, "no_healthy_replica", "No replica of this deployment is healthy right now.", deployment=route.slug
            )
        body = await request.read()
        headers = {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
        start = next(self.turns) % len(replicas)
        for replica in replicas[start:] + replicas[:start]:  # round robin, then fail over
            url = URL(f"{replica.url}/v1/{request['replica_path']}", encoded=True)  # checked, as the caller encoded it
            try:
                upstream = await self.session.request(
                    request.method, url, data=body, headers=headers, params=request.query or None
                )
            except aiohttp.SocketTimeoutError:  # connected, but no answer in time: slow, not dead
                raise Refusal(
                    504, "upstream_timeout", "The replica did not answer in time.", replica=replica.name
                ) from None
            except (aiohttp.ClientConnectionError, OSError) as error:  # refused, reset, connect timeout: down
                self._replica_down(route, replica, f"gateway could not reach it: {type(error).__name__}")
                continue
            try:
                return await self._relay(request, upstream, key, route, replica, body)
            finally:
                upstream.release()
        raise Refusal(
            502,
            "upstream_unavailable",
            "No replica answered; they are marked unhealthy until they recover.",
            deployment=route.slug,
        )

    async def _awake(self, route: routes.Route) -> routes.Route:
        """A deployment at zero replicas, or going there: ask the control plane to wake it, once for all the calls
        this process holds for it (the control plane, on the locked deployment, wakes it once for all the gateways,
        and one whose servers are still stopping once they have), then hold the call until the snapshot routes to a
        healthy replica, for at most GATEWAY_WAKE_SECONDS; else 503 with a Retry-After. The call was admitted
        first (key, rate, budget): nobody without a key wakes anything."""
        slug = route.slug
        if slug not in self.waking and route.state != DeploymentState.WAKING:
            asking = self.waking[slug] = asyncio.create_task(self._ask_to_wake(route.deployment_id))
            asking.add_done_callback(lambda _done: self.waking.pop(slug, None))
        asking = self.waking.get(slug)
        deadline = time.monotonic() + settings.GATEWAY_WAKE_SECONDS
        while time.monotonic() < deadline:
            current = self.snapshot.routes.get(slug)
            if current is None:
                raise Refusal(404, "unknown_deployment", f"No deployment '{slug}' is serving.")
            if not current.asleep and current.replicas:
                return current
            if asking is not None and asking.done() and isinstance(asking.result(), Refusal):
                raise asking.result()
            await asyncio.sleep(settings.GATEWAY_POLL_SECONDS)
        raise _retry_shortly(
            "waking_up",
            f"The deployment was scaled to zero for being idle and is starting a replica; it did not answer within "
            f"{settings.GATEWAY_WAKE_SECONDS:g} s. Try again shortly.",
            deployment=slug,
        )

    async def _ask_to_wake(self, deployment_id: int) -> str | Refusal:
        """The control plane's answer to a wake: the deployment's state, or why it refused (the quota)."""
        from serving.deployments import deployment_wake

        try:
            return await self._in_db(lambda: deployment_wake(deployment_id=deployment_id))
        except DomainError as refused:
            return Refusal(refused.status_code, refused.code, refused.message, **refused.details)
        except Exception:
            logger.exception("Could not wake deployment #%s", deployment_id)
            return _retry_shortly(
                "wake_failed", "The deployment is scaled to zero and could not be woken now; try again shortly."
            )

    def _still_down(self, replica_id: int, snapshot_started: float) -> bool:
        """Found dead here and not yet recorded by the control plane when the snapshot was read."""
        if replica_id not in self.found_down:
            return False
        recorded_at = self.found_down[replica_id]
        return recorded_at is None or recorded_at > snapshot_started

    def _replica_down(self, route: routes.Route, replica: routes.Replica, reason: str) -> None:
        logger.warning("Replica %s/%s failed: %s", route.slug, replica.name, reason)
        # Out of this process's rotation now: the call's route, and the current snapshot's if a reload replaced
        # it while the call was trying the replicas (that snapshot was read before this one was found dead).
        for held in (route, self.snapshot.routes.get(route.slug, route)):
            held.replicas = [r for r in held.replicas if r.id != replica.id]
        self.found_down[replica.id] = None
        from serving.deployments import replica_failed

        future = asyncio.get_running_loop().run_in_executor(
            self.db, lambda: (close_old_connections(), replica_failed(replica_id=replica.id, reason=reason))
        )

        def recorded(done) -> None:
            if done.exception():  # the next reload shows the control plane's view again
                logger.error("Could not mark %s down", replica.name)
                self.found_down.pop(replica.id, None)
            else:
                self.found_down[replica.id] = time.monotonic()

        future.add_done_callback(recorded)

    async def _relay(self, request, upstream, key, route, replica, sent: bytes) -> web.StreamResponse:
        content_type = upstream.headers.get("Content-Type", "application/json")
        if content_type.startswith("text/event-stream"):
            return await self._stream(request, upstream, key, route, replica, sent)
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise Refusal(
                502, "upstream_unavailable", f"The replica broke off its answer: {type(error).__name__}"
            ) from None
        if upstream.status == 200:
            found = _usage_of(body)
            if found:
                self._meter(key, route, int(found.get("prompt_tokens", 0)), int(found.get("completion_tokens", 0)))
        answer = web.Response(body=body, status=upstream.status)
        answer.headers["Content-Type"] = content_type
        return answer

    async def _stream(self, request, upstream, key, route, replica, sent: bytes) -> web.StreamResponse:
        """Each event is written (and so sent) as it arrives; the last `usage` seen is what the answer cost, else
        the gateway counts it (_StreamCount)."""
        answer = web.StreamResponse(status=upstream.status)
        answer.headers.update(
            {"Content-Type": upstream.headers["Content-Type"], "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await answer.prepare(request)
        found, counted = None, _StreamCount()
        try:
            async for line in upstream.content:
                if line.startswith(b"data: {"):
                    try:
                        event = json.loads(line[6:])
                    except ValueError:
                        event = {}
                    if event.get("usage"):
                        found = event["usage"]
                    else:
                        counted.add(event)
                await answer.write(line)
        except (aiohttp.ClientError, TimeoutError) as error:
            logger.warning("Stream from %s broke: %s", route.slug, error)
        finally:
            if upstream.status == 200:
                if found:
                    self._meter(key, route, int(found.get("prompt_tokens", 0)), int(found.get("completion_tokens", 0)))
                elif counted.completion:  # after the answer has gone out: the caller does not wait for it
                    task = asyncio.create_task(
                        self._meter_stream(key, route, replica, request["replica_path"], sent, counted.completion)
                    )
                    self.counting.add(task)
                    task.add_done_callback(self.counting.discard)
        await answer.write_eof()
        return answer

    async def _prompt_tokens(self, replica: routes.Replica, path: str, sent: bytes) -> int:
        """The prompt's tokens as the runtime counts them: the same request again, to the same replica, without
        streaming and for one token; its `usage.prompt_tokens` comes from the runtime's own chat template and
        tokenizer (right for any model, where counting the text here would not know the template), and llama.cpp
        reuses the prompt it has just evaluated, so this costs about one token."""
        try:
            body = {**json.loads(sent), "stream": False, "max_tokens": 1}
            body.pop("stream_options", None)
            async with self.session.post(f"{replica.url}/v1/{path}", json=body, timeout=self.timeout) as answer:
                found = (await answer.json()).get("usage") or {} if answer.status == 200 else {}
            return int(found.get("prompt_tokens", 0))
        except (aiohttp.ClientError, TimeoutError, ValueError, TypeError, AttributeError):
            return 0

    async def _meter_stream(self, key, route, replica, path: str, sent: bytes, completion: int) -> None:
        self._meter(key, route, await self._prompt_tokens(replica, path, sent), completion)

    def _meter(self, key: routes.Key, route: routes.Route, prompt: int, completion: int) -> None:
        now = time.time()
        if now >= self.today_until:
            self.today, self.today_until = timezone.localdate(), now + 1.0
        row = self.tally.get((route.request_id, key.prefix, self.today))
        if row is None:
            row = self.tally[(route.request_id, key.prefix, self.today)] = [route.project_id, route.model, 0, 0, 0]
        row[2] += 1
        row[3] += prompt
        row[4] += completion
        self.local_tokens[route.request_id] += prompt + completion
        self.last_use[key.prefix] = now


def _retry_shortly(code: str, message: str, **details) -> Refusal:
    """503 for a deployment at zero that is not serving yet, with when to try again."""
    return Refusal(
        503,
        code,
        message,
        headers={"Retry-After": str(WAKE_RETRY_AFTER_SECONDS)},
        **details,
        retry_after=WAKE_RETRY_AFTER_SECONDS,
    )


def _usage_of(body: bytes) -> dict | None:
    if b'"usage"' not in body:
        return None
    try:
        return json.loads(body).get("usage") or None
    except (ValueError, AttributeError):
        return None


def run(*, host: str, port: int, redis_url: str = "", reuse_port: bool = False) -> None:
    """Serve until SIGTERM/SIGINT; then finish the calls in flight and flush the tallies. SIGUSR1 prints every
    thread's stack to the log (from C, so it works with the event loop stuck too)."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import uvloop  # a faster event loop than asyncio's own

    with diagnostics.profiled(os.environ.get("GATEWAY_PROFILE", ""), os.environ.get("GATEWAY_STALL_LOG", "")) as stalls:
        gateway = Gateway(redis_url=redis_url, stalls=stalls)
        web.run_app(
            gateway.app(),
            host=host,
            port=port,
            reuse_port=reuse_port,
            access_log=None,
            print=None,
            shutdown_timeout=settings.GATEWAY_SHUTDOWN_SECONDS,
            handle_signals=True,
            loop=uvloop.new_event_loop(),
        )
