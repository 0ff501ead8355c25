"""A small OpenAI-compatible inference server: the `simulated` model-serving runtime.

    python -m serving.inference_server --host 127.0.0.1 --port 8100 --model NAME
        [--replica NAME] [--max-tokens N] [--context-length N] [--latency-ms N]

A standalone process (standard library only, no Django) started by the provisioning driver, one per replica.
It serves `GET /health` (with `in_flight`, the answers under way besides this one), `GET /v1/models`,
`POST /v1/chat/completions` and `POST /v1/completions` in OpenAI's shapes, streaming included (`"stream": true`:
server-sent events over chunked HTTP/1.1, one event per token, the last event carries `finish_reason` and `usage`,
then `data: [DONE]`; HTTP/1.0 clients get it close-delimited).
A list of prompts gets one choice per prompt. Errors use OpenAI's error shape.
`--port 0` picks a free port; the line `ready on http://HOST:PORT` on stdout names it. SIGTERM stops accepting,
lets answers in flight finish (up to SHUTDOWN_GRACE_SECONDS) and exits 0.

Tokens, the rule behind every `usage` number:
- Text splits into pieces: runs of word characters (`\\w+`) and single other non-space characters (punctuation).
  A piece counts ceil(len / 4) tokens, so "GPU" is 1, "inference" is 3 and "," is 1; whitespace is free.
- A completions prompt counts as its text. A chat prompt counts 3 tokens per message (role and delimiters, as
  chat templates add) plus its text content, plus 3 tokens that prime the assistant's reply.
- The answer is deterministic: words drawn from a seed that is a hash of the messages (or the prompt), emitted one
  token per stream event (a long word spans several tokens). It is min(max_tokens, --max-tokens, room left in
  --context-length) tokens long; `max_tokens` defaults to 64. Without `max_tokens` and uncut, the 64-token answer
  is the model's natural one (`finish_reason` "stop"); otherwise the budget cut it ("length"). A shorter answer
  is a prefix of a longer one for the same input. `temperature` is validated and ignored.
"""

import argparse
import asyncio
import hashlib
import json
import math
import re
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

PIECE_PATTERN = re.compile(r"\w+|[^\w\s]")
CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 3
REPLY_PRIMING_TOKENS = 3
DEFAULT_MAX_TOKENS = 64
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
SHUTDOWN_GRACE_SECONDS = 10.0
SENTENCE_END_BELOW, PUNCTUATION_BELOW = 26, 40  # of 256: a word ends its sentence 1 time in 10, takes a comma 1 in 18
WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "on",
    "with",
    "as",
    "by",
    "this",
    "it",
    "be",
    "are",
    "from",
    "at",
    "or",
    "an",
    "which",
    "can",
    "each",
    "when",
    "more",
    "than",
    "model",
    "data",
    "token",
    "layer",
    "memory",
    "node",
    "card",
    "cluster",
    "batch",
    "request",
    "answer",
    "result",
    "value",
    "signal",
    "vector",
    "graph",
    "training",
    "inference",
    "throughput",
    "latency",
    "schedule",
    "queue",
    "rack",
    "power",
    "cooling",
    "budget",
    "project",
    "tenant",
    "quota",
    "compute",
    "kernel",
    "tensor",
    "gradient",
    "weight",
    "attention",
    "context",
    "prompt",
    "output",
    "stream",
    "cache",
    "replica",
    "gateway",
    "runs",
    "keeps",
    "moves",
    "holds",
    "makes",
    "shows",
    "needs",
    "gives",
    "uses",
    "finds",
    "builds",
    "scales",
    "serves",
    "learns",
    "checks",
    "returns",
    "fast",
    "small",
    "large",
    "stable",
    "quiet",
    "ready",
    "shared",
    "local",
    "remote",
    "steady",
    "early",
    "later",
    "every",
    "other",
    "simple",
    "clear",
)


def count_tokens(text: str) -> int:
    return sum(math.ceil(len(piece) / CHARS_PER_TOKEN) for piece in PIECE_PATTERN.findall(text))


def answer_tokens(seed: str, count: int) -> list[str]:
    """The first `count` tokens of the answer to `seed`: words, word pieces and punctuation, each exactly one token
    by count_tokens. Two bytes of the seed's SHAKE-256 stream pick each word and what follows it, so the answer is
    fixed by the seed and a shorter answer is a prefix of a longer one."""
    randomness = hashlib.shake_256(seed.encode(errors="surrogatepass")).digest(2 * count)  # at most one word per token
    tokens, separator, capitalize = [], "", True
    for pick, mark in zip(randomness[0::2], randomness[1::2], strict=True):
        word = WORDS[pick % len(WORDS)]
        word = word.capitalize() if capitalize else word
        pieces = [word[start : start + CHARS_PER_TOKEN] for start in range(0, len(word), CHARS_PER_TOKEN)]
        tokens += [separator + pieces[0], *pieces[1:]]
        separator, capitalize = " ", mark < SENTENCE_END_BELOW
        if mark < PUNCTUATION_BELOW:
            tokens.append("." if capitalize else ",")
        if len(tokens) >= count:
            break
    return tokens[:count]


# --- Requests: validation and planning ---------------------------------------------------------------------------


class ApiError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, headers: tuple = ()):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code, "param": self.param}}


@dataclass(frozen=True)
class ServerConfig:
    model: str
    replica: str
    max_tokens: int
    context_length: int
    latency_ms: int


@dataclass(frozen=True)
class Generation:
    tokens: list[str]
    finish_reason: str


@dataclass(frozen=True)
class Job:
    """One validated completion request: the answer to each prompt, and how to send them."""

    chat: bool
    generations: list[Generation]
    prompt_tokens: int
    stream: bool

    def usage(self) -> dict:
        completion = sum(len(generation.tokens) for generation in self.generations)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }


def parse_body(raw: bytes, config: ServerConfig) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:  # also bad UTF-8 and absurd nesting
        raise ApiError(400, f"The request body is not valid JSON: {error}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", "invalid_json")
    if "model" not in body:
        raise ApiError(400, "Missing required parameter: 'model'.", "missing_required_parameter", "model")
    if body["model"] != config.model:
        raise ApiError(
            404,
            f"The model '{body['model']}' does not exist; this server serves '{config.model}'.",
            "model_not_found",
            "model",
        )
    temperature = body.get("temperature")  # ignored, but refused where a real server would refuse it
    if temperature is not None and (type(temperature) not in (int, float) or not 0 <= temperature <= 2):
        raise ApiError(400, "'temperature' must be a number from 0 to 2.", "invalid_value", "temperature")
    return body


def requested_max_tokens(body: dict) -> int | None:
    value = body.get("max_tokens")
    if value is not None and (type(value) is not int or value < 1):
        raise ApiError(400, "'max_tokens' must be a positive integer.", "invalid_value", "max_tokens")
    return value


def wants_stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if type(stream) is not bool:
        raise ApiError(400, "'stream' must be true or false.", "invalid_type", "stream")
    return stream


def plan(seed: str, prompt_tokens: int, requested: int | None, config: ServerConfig, param: str) -> Generation:
    """The answer's length within the server's limits, as vLLM does: a request that cannot fit is refused."""
    if prompt_tokens >= config.context_length or prompt_tokens + (requested or 0) > config.context_length:
        raise ApiError(
            400,
            f"This model's maximum context length is {config.context_length} tokens; the prompt "
            f"has {prompt_tokens} and {requested or 0} were requested for the completion.",
            "context_length_exceeded",
            param,
        )
    count = min(requested or DEFAULT_MAX_TOKENS, config.max_tokens, config.context_length - prompt_tokens)
    natural_end = requested is None and count == DEFAULT_MAX_TOKENS
    return Generation(answer_tokens(seed, count), "stop" if natural_end else "length")


def message_text(message, position: int) -> str:
    """A message's text: string content, or the text parts of a list of content parts."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(
            400, f"messages[{position}] must be an object with a string 'role'.", "invalid_value", "messages"
        )
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        return " ".join(str(part.get("text", "")) for part in content if part.get("type") == "text")
    raise ApiError(
        400, f"messages[{position}].content must be a string or a list of content parts.", "invalid_type", "messages"
    )


def chat_job(body: dict, config: ServerConfig) -> Job:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            400,
            "'messages' must be a non-empty list of {role, content} objects.",
            "missing_required_parameter",
            "messages",
        )
    texts = [message_text(message, position) for position, message in enumerate(messages)]
    prompt_tokens = sum(MESSAGE_OVERHEAD_TOKENS + count_tokens(text) for text in texts) + REPLY_PRIMING_TOKENS
    seed = json.dumps(messages, sort_keys=True)
    generation = plan(seed, prompt_tokens, requested_max_tokens(body), config, "messages")
    return Job(True, [generation], prompt_tokens, wants_stream(body))


def completion_job(body: dict, config: ServerConfig) -> Job:
    """One choice per prompt, as OpenAI answers a list of prompts."""
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(text, str) for text in prompts):
        raise ApiError(
            400, "'prompt' must be a string or a non-empty list of strings.", "missing_required_parameter", "prompt"
        )
    requested = requested_max_tokens(body)
    counts = [count_tokens(text) for text in prompts]
    generations = [plan(text, count, requested, config, "prompt") for text, count in zip(prompts, counts, strict=True)]
    return Job(False, generations, sum(counts), wants_stream(body))


# --- Answers: OpenAI response bodies and stream chunks ------------------------------------------------------------


def choice_body(chat: bool, index: int, generation: Generation) -> dict:
    text = "".join(generation.tokens)
    if chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "finish_reason": generation.finish_reason,
        }
    return {"index": index, "text": text, "logprobs": None, "finish_reason": generation.finish_reason}


def delta_choice(chat: bool, index: int, token: str, finish_reason: str | None = None, first: bool = False) -> dict:
    if chat:
        delta = {"role": "assistant", "content": token} if first else {"content": token} if token else {}
        return {"index": index, "delta": delta, "finish_reason": finish_reason}
    return {"index": index, "text": token, "logprobs": None, "finish_reason": finish_reason}


def answer_envelope(job: Job, model: str, streaming: bool) -> dict:
    prefix, kind = ("chatcmpl", "chat.completion") if job.chat else ("cmpl", "text_completion")
    kind = f"{kind}.chunk" if streaming and job.chat else kind
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()), "model": model}


def answer_body(job: Job, model: str) -> dict:
    choices = [choice_body(job.chat, index, generation) for index, generation in enumerate(job.generations)]
    return {**answer_envelope(job, model, streaming=False), "choices": choices, "usage": job.usage()}


def stream_events(job: Job, model: str) -> Iterator[bytes]:
    """One event per token, a closing event with every finish_reason and the usage, then [DONE]."""
    envelope = answer_envelope(job, model, streaming=True)
    for index, generation in enumerate(job.generations):
        for position, token in enumerate(generation.tokens):
            yield sse({**envelope, "choices": [delta_choice(job.chat, index, token, first=position == 0)]})
    closing = [
        delta_choice(job.chat, index, "", generation.finish_reason) for index, generation in enumerate(job.generations)
    ]
    yield sse({**envelope, "choices": closing, "usage": job.usage()})
    yield b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + compact_json(payload) + b"\n\n"


def compact_json(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


# --- HTTP/1.1 over asyncio streams ---------------------------------------------------------------------------------
# One event loop instead of a thread per connection: keep-alive clients cost nothing while idle, streams and
# --latency-ms wait without holding a thread, and there is no GIL contention between connection threads. Measured
# with 50 keep-alive clients on 2 cores: ~3-4k answers/s here, ~0.8k with http.server.ThreadingHTTPServer.


@dataclass
class HttpRequest:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        return self.version == "HTTP/1.1" and self.headers.get("connection", "").lower() != "close"


@dataclass
class Reply:
    status: int
    payload: dict | None = None
    events: Iterator[bytes] | None = None
    headers: tuple = ()


STATUS_TEXT = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> HttpRequest | None:
    """The next request on the connection, None when the client closed it between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise ApiError(400, "Incomplete request head.", "bad_request") from None
        return None
    except asyncio.LimitOverrunError:
        raise ApiError(431, "The request head is too large.", "request_header_too_large") from None
    request = parse_head(head)
    if request.headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.body = await read_body(reader, request.headers)
    return request


def parse_head(head: bytes) -> HttpRequest:
    try:
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ")
        headers = {}
        for line in filter(None, header_lines):
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    except ValueError:
        raise ApiError(400, "Malformed request line or header.", "bad_request") from None
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise ApiError(400, f"Unsupported protocol {version!r}.", "bad_request")
    return HttpRequest(method, target.split("?", 1)[0], version, headers)


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await read_chunked_body(reader)
    length = headers.get("content-length", "0")
    if not (length.isascii() and length.isdigit()):
        raise ApiError(400, "Invalid Content-Length.", "bad_request")
    if int(length) > MAX_BODY_BYTES:
        raise ApiError(413, f"The request body must be at most {MAX_BODY_BYTES} bytes.", "request_too_large")
    return await reader.readexactly(int(length))


async def read_chunked_body(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        try:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        except ValueError:
            raise ApiError(400, "Malformed chunk size.", "bad_request") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # optional trailers
                pass
            return bytes(body)
        if len(body) + size > MAX_BODY_BYTES:
            raise ApiError(413, f"The request body must be at most {MAX_BODY_BYTES} bytes.", "request_too_large")
        body += await reader.readexactly(size)
        await reader.readexactly(2)


async def write_reply(writer: asyncio.StreamWriter, reply: Reply, keep_alive: bool, chunked: bool) -> None:
    headers = [
        f"HTTP/1.1 {reply.status} {STATUS_TEXT.get(reply.status, '')}",
        "Server: compute-catalog-simulated",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
        *reply.headers,
    ]
    if reply.events is None:
        body = compact_json(reply.payload)
        headers += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + body)
        await writer.drain()
        return
    headers += ["Content-Type: text/event-stream", "Cache-Control: no-cache"]
    headers += ["Transfer-Encoding: chunked"] if chunked else []
    writer.write(("\r\n".join(headers) + "\r\n\r\n").encode())
    for event in reply.events:  # every token leaves as its own write; yielding keeps long streams from hogging
        writer.write(b"%x\r\n%s\r\n" % (len(event), event) if chunked else event)
        await writer.drain()
        await asyncio.sleep(0)
    if chunked:
        writer.write(b"0\r\n\r\n")
    await writer.drain()


@dataclass(eq=False)
class Connection:
    writer: asyncio.StreamWriter
    task: asyncio.Task
    busy: bool = False  # between reading a request and the end of its answer


class InferenceServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.connections: set[Connection] = set()
        self.draining = False
        self.routes: dict[str, dict[str, Callable[[HttpRequest], Awaitable[Reply]]]] = {
            "/health": {"GET": self.health},
            "/v1/models": {"GET": self.list_models},
            "/v1/chat/completions": {"POST": self.chat_completions},
            "/v1/completions": {"POST": self.completions},
        }

    async def health(self, request: HttpRequest) -> Reply:
        # The health check's own connection is busy too; it is not an answer in flight.
        in_flight = sum(connection.busy for connection in self.connections) - 1
        return Reply(
            200, {"status": "ok", "model": self.config.model, "replica": self.config.replica, "in_flight": in_flight}
        )

    async def list_models(self, request: HttpRequest) -> Reply:
        model = {"id": self.config.model, "object": "model", "owned_by": "compute-catalog"}
        return Reply(200, {"object": "list", "data": [model]})

    async def chat_completions(self, request: HttpRequest) -> Reply:
        return await self.answer(chat_job(parse_body(request.body, self.config), self.config))

    async def completions(self, request: HttpRequest) -> Reply:
        return await self.answer(completion_job(parse_body(request.body, self.config), self.config))

    async def answer(self, job: Job) -> Reply:
        if self.config.latency_ms:
            await asyncio.sleep(self.config.latency_ms / 1000)
        if job.stream:
            return Reply(200, events=stream_events(job, self.config.model))
        return Reply(200, answer_body(job, self.config.model))

    async def dispatch(self, request: HttpRequest) -> Reply:
        methods = self.routes.get(request.path)
        if methods is None:
            raise ApiError(404, f"No such endpoint: {request.method} {request.path}.", "not_found")
        handler = methods.get(request.method)
        if handler is None:
            raise ApiError(
                405,
                f"{request.path} accepts {', '.join(methods)}, not {request.method}.",
                "method_not_allowed",
                headers=(f"Allow: {', '.join(methods)}",),
            )
        return await handler(request)

    async def reply_to(self, request: HttpRequest) -> Reply:
        try:
            return await self.dispatch(request)
        except ApiError as error:
            return Reply(error.status, error.body(), headers=error.headers)
        except Exception as error:  # a bug must cost one answer, never the server
            print(f"error answering {request.method} {request.path}: {error!r}", file=sys.stderr, flush=True)
            return Reply(500, ApiError(500, "The server failed to answer.", "internal_error").body())

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(writer, asyncio.current_task())
        self.connections.add(connection)
        try:
            await self.converse(reader, writer, connection)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away or broke off mid-request
        finally:
            self.connections.discard(connection)
            writer.close()

    async def converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: Connection
    ) -> None:
        while not self.draining:
            try:
                request = await read_request(reader, writer)
            except ApiError as error:  # the request itself is unreadable: answer, then hang up
                await write_reply(writer, Reply(error.status, error.body()), keep_alive=False, chunked=False)
                return
            if request is None:
                return
            connection.busy = True
            reply = await self.reply_to(request)
            keep_alive = request.keep_alive and not self.draining
            await write_reply(writer, reply, keep_alive, chunked=request.version == "HTTP/1.1")
            connection.busy = False
            if not keep_alive:
                return

    async def run(self, host: str, port: int) -> None:
        server = await asyncio.start_server(self.serve_connection, host, port, limit=MAX_HEAD_BYTES, backlog=1024)
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        bound_port = server.sockets[0].getsockname()[1]
        print(f"ready on http://{f'[{host}]' if ':' in host else host}:{bound_port}", flush=True)
        await stop.wait()
        server.close()
        await self.drain()

    async def drain(self) -> None:
        """Hang up idle keep-alive connections; give answers in flight the grace period to finish.

        Closing (not cancelling) a connection lets its reader see EOF and end quietly; Python 3.11 logs a
        traceback for every cancelled connection task."""
        self.draining = True
        for connection in self.connections:
            if not connection.busy:
                connection.writer.close()
        if self.connections:
            await asyncio.wait([connection.task for connection in self.connections], timeout=SHUTDOWN_GRACE_SECONDS)
        for connection in list(self.connections):
            connection.writer.transport.abort()


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="OpenAI-compatible simulated inference server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--model", required=True, help="the only model name this server answers to")
    parser.add_argument("--replica", default="replica-0", help="name reported by /health")
    parser.add_argument("--max-tokens", type=positive_int, default=4096, help="cap on completion tokens")
    parser.add_argument("--context-length", type=positive_int, default=8192, help="prompt + completion tokens")
    parser.add_argument("--latency-ms", type=int, default=0, help="fixed delay added to each completion")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    config = ServerConfig(
        arguments.model, arguments.replica, arguments.max_tokens, arguments.context_length, max(0, arguments.latency_ms)
    )
    asyncio.run(InferenceServer(config).run(arguments.host, arguments.port))


if __name__ == "__main__":
    main()
