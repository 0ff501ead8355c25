"""wait_until_answers, which the benchmarks and the server fixtures use to wait for the servers they start."""

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from config.probes import NotAnswering, wait_until_answers

pytestmark = pytest.mark.integration  # starts processes of its own


class _Answers(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/up" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def test_returns_once_the_url_answers_200(server):
    wait_until_answers(f"{server}/up", seconds=5)


def test_a_url_that_never_answers_200_times_out(server):
    started = time.monotonic()
    with pytest.raises(NotAnswering, match=r"did not answer within 0\.5 s"):
        wait_until_answers(f"{server}/down", seconds=0.5, interval=0.05)
    assert 0.5 <= time.monotonic() - started < 3


def test_a_server_process_that_exits_ends_the_wait_at_once(server):
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    started = time.monotonic()
    with pytest.raises(NotAnswering, match="exited with 3"):
        wait_until_answers(f"{server}/down", seconds=30, process=process)
    assert time.monotonic() - started < 1
