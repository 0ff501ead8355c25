"""The `simulated` model-serving runtime: the OpenAI-compatible inference server, run as the real subprocess the
provisioning driver starts, and spoken to over HTTP with httpx. No database."""

import json
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration  # starts processes of its own

ROOT = Path(__file__).resolve().parents[2]
MODEL, REPLICA, SERVER_MAX_TOKENS = "sim-llama-8b", "replica-a", 100
CHAT = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Summarise inference throughput, please!"},
    ],
}
# By the documented rule: (3 + 5) + (3 + 13) + 3 to prime the reply. "You are terse." is You, are, ter|se, "." = 5;
# the question is Summ|aris|e, infe|renc|e, thro|ughp|ut, ",", plea|se, "!" = 13.
CHAT_PROMPT_TOKENS = 27
PROMPT = "Rack r12 reports 8 healthy cards."  # Rack, r12, repo|rts, 8, heal|thy, card|s, "." = 10
PROMPT_TOKENS = 10


def documented_token_count(text: str) -> int:
    """The module docstring's rule, written out independently of the server's code."""
    return sum(math.ceil(len(piece) / 4) for piece in re.findall(r"\w+|[^\w\s]", text))


def start_server(*arguments: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.inference_server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model",
            MODEL,
            "--replica",
            REPLICA,
            *arguments,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = process.stdout.readline()  # the server names the free port it bound
    assert ready.startswith("ready on http://127.0.0.1:"), ready
    return process, ready.split()[-1]


@pytest.fixture(scope="module")
def server_url():
    process, url = start_server("--max-tokens", str(SERVER_MAX_TOKENS), "--context-length", "512")
    yield url
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0


@pytest.fixture
def client(server_url):
    with httpx.Client(base_url=server_url, timeout=10) as client:
        yield client


def sse_events(client: httpx.Client, path: str, body: dict) -> list:
    """The stream's `data:` payloads, decoded as they arrive; `[DONE]` stays a string."""
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["transfer-encoding"] == "chunked"
        payloads = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    return [payload if payload == "[DONE]" else json.loads(payload) for payload in payloads]


def test_health_and_models(client):
    assert client.get("/health").json() == {"status": "ok", "model": MODEL, "replica": REPLICA, "in_flight": 0}
    assert client.get("/v1/models").json() == {
        "object": "list",
        "data": [{"id": MODEL, "object": "model", "owned_by": "compute-catalog"}],
    }


def test_chat_answer_is_deterministic_and_metered_by_the_documented_rule(client):
    first, second = (client.post("/v1/chat/completions", json=CHAT) for _ in range(2))

    assert first.status_code == 200
    assert first.headers["connection"] == "keep-alive"
    answer = first.json()
    assert answer["object"] == "chat.completion"
    assert answer["id"].startswith("chatcmpl-") and answer["model"] == MODEL
    assert isinstance(answer["created"], int)
    [choice] = answer["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    content = choice["message"]["content"]
    assert re.fullmatch(r"[A-Z][a-z]*([ ,.]+[A-Za-z]+)*[,.]?", content)
    assert answer["usage"] == {"prompt_tokens": CHAT_PROMPT_TOKENS, "completion_tokens": 64, "total_tokens": 91}
    assert documented_token_count(content) == 64
    assert second.json()["choices"] == answer["choices"] and second.json()["usage"] == answer["usage"]


def test_another_question_gets_another_answer(client):
    other = {**CHAT, "messages": [*CHAT["messages"][:1], {"role": "user", "content": "And latency?"}]}
    answers = [
        client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        for body in (CHAT, other)
    ]
    assert answers[0] != answers[1]


def test_max_tokens_cuts_the_same_answer_short(client):
    full = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]

    short = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5}).json()

    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 5 == documented_token_count(short["choices"][0]["message"]["content"])
    assert full.startswith(short["choices"][0]["message"]["content"])


def test_server_max_tokens_caps_the_request(client):
    answer = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 400}).json()

    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == SERVER_MAX_TOKENS


def test_completion_of_a_prompt_and_of_a_list_of_prompts(client):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 7}
    single = client.post("/v1/completions", json=body).json()
    batch = client.post("/v1/completions", json={**body, "prompt": [PROMPT, "Why?"]}).json()

    assert single["object"] == "text_completion" and single["id"].startswith("cmpl-")
    [choice] = single["choices"]
    assert choice["finish_reason"] == "length" and documented_token_count(choice["text"]) == 7
    assert single["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 7, "total_tokens": 17}
    assert client.post("/v1/completions", json=body).json()["choices"] == single["choices"]
    assert [choice["index"] for choice in batch["choices"]] == [0, 1]
    assert batch["choices"][0]["text"] == choice["text"]
    assert batch["usage"] == {"prompt_tokens": PROMPT_TOKENS + 2, "completion_tokens": 14, "total_tokens": 26}


def test_chat_stream_is_the_same_answer_token_by_token(client):
    answer = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 20}).json()

    events = sse_events(client, "/v1/chat/completions", {**CHAT, "max_tokens": 20})

    *chunks, closing, done = events
    assert done == "[DONE]"
    assert len(chunks) == 20  # one event per token
    assert {chunk["object"] for chunk in events[:-1]} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in events[:-1]}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (
        "".join(chunk["choices"][0]["delta"]["content"] for chunk in chunks)
        == answer["choices"][0]["message"]["content"]
    )
    assert closing["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert closing["usage"] == answer["usage"]


def test_completion_stream_ends_with_usage_then_done(client):
    body = {"model": MODEL, "prompt": PROMPT}
    answer = client.post("/v1/completions", json=body).json()

    *chunks, closing, done = sse_events(client, "/v1/completions", body)

    assert done == "[DONE]" and len(chunks) == 64
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == answer["choices"][0]["text"]
    assert closing["choices"][0]["finish_reason"] == "stop" == answer["choices"][0]["finish_reason"]
    assert (
        closing["usage"]
        == answer["usage"]
        == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 64, "total_tokens": PROMPT_TOKENS + 64}
    )


def test_chunked_request_body_is_read(client):
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 3}).encode()

    response = client.post("/v1/completions", content=iter([body[:10], body[10:]]))  # no length: chunked

    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400, "invalid_json"),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400, "invalid_json"),
        ("POST", "/v1/chat/completions", json.dumps({"messages": CHAT["messages"]}), 400, "missing_required_parameter"),
        ("POST", "/v1/chat/completions", json.dumps({"model": MODEL}), 400, "missing_required_parameter"),
        ("POST", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": ["hi"]}), 400, "invalid_value"),
        ("POST", "/v1/chat/completions", json.dumps({**CHAT, "model": "gpt-9"}), 404, "model_not_found"),
        ("POST", "/v1/chat/completions", json.dumps({**CHAT, "max_tokens": 0}), 400, "invalid_value"),
        ("POST", "/v1/chat/completions", json.dumps({**CHAT, "stream": "yes"}), 400, "invalid_type"),
        ("POST", "/v1/chat/completions", json.dumps({**CHAT, "temperature": 7}), 400, "invalid_value"),
        ("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": 42}), 400, "missing_required_parameter"),
        (
            "POST",
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 510}),
            400,
            "context_length_exceeded",
        ),
        (
            "POST",
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": "word " * 600}),
            400,
            "context_length_exceeded",
        ),
        ("GET", "/v1/embeddings", None, 404, "not_found"),
        ("GET", "/v1/chat/completions", None, 405, "method_not_allowed"),
        ("POST", "/health", b"{}", 405, "method_not_allowed"),
    ],
)
def test_bad_requests_get_openai_errors(client, method, path, body, status, code):
    response = client.request(method, path, content=body)

    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]
    assert client.get("/health").status_code == 200


def test_malformed_http_is_refused_and_the_server_keeps_serving(client, server_url):
    host, port = server_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"NONSENSE\r\n\r\n")
        answer = raw.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert client.get("/health").status_code == 200


def test_fifty_concurrent_clients_all_get_their_answers(client):
    def ask(number: int) -> dict:
        body = {"model": MODEL, "prompt": f"question {number}", "max_tokens": 16, "stream": number % 2 == 1}
        if body["stream"]:
            *_, closing, done = sse_events(client, "/v1/completions", body)
            assert done == "[DONE]"
            return closing["usage"]
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200
        return response.json()["usage"]

    with ThreadPoolExecutor(max_workers=50) as pool:
        usages = list(pool.map(ask, range(50)))

    assert all(usage == {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19} for usage in usages)


def test_sigterm_lets_the_answer_in_flight_finish():
    process, url = start_server("--latency-ms", "1500")
    answers = []
    asking = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": PROMPT}, timeout=10)
        )
    )
    asking.start()
    wait_until_answering(url)  # the server holds the request: SIGTERM now meets an answer in flight

    process.send_signal(signal.SIGTERM)

    assert process.wait(timeout=10) == 0
    asking.join()
    assert answers[0].status_code == 200 and answers[0].json()["usage"]["completion_tokens"] == 64


def wait_until_answering(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/health", timeout=5).json()["in_flight"] != 1:
        assert time.monotonic() < deadline, "the server never started answering"
        time.sleep(0.01)
