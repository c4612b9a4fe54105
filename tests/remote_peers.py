"""Small real HTTP servers for the load-test client's tests (tests/test_remote_client*.py):
hostile peers — not mocks of vLLM — that list models, stream, cut streams, answer errors and
serve /metrics the way each test scripts them."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from engine.remote.loadfile import load_loadtest, load_to_bytes
from engine.remote.loadtest import LoadTest
from engine.remote.record import LoadConfig, LoadRun

MODEL = "toy"


def was_bug(why: str) -> pytest.MarkDecorator:
    """A fault of engine/remote this test found in review, since fixed: the test keeps it fixed
    (the mark only records what it was)."""
    return pytest.mark.skipif(False, reason=f"was: {why}")


METRICS = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="toy"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="toy"} 0.25
"""


# --- the servers ------------------------------------------------------------------------------

@dataclass
class Peer:
    """One hostile server: `routes(handler, method, path, body)` answers every request."""

    routes: Callable[[BaseHTTPRequestHandler, str, str, dict], None]
    url: str = ""
    quit: threading.Event = field(default_factory=threading.Event)
    sent: dict[str, int] = field(default_factory=dict)  # bytes a route managed to send


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep pytest's output clean
        pass

    def _answer(self, method: str) -> None:
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        try:
            self.server.peer.routes(self, method, self.path, body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up, as it may

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")


@contextmanager
def serve(routes: Callable[[BaseHTTPRequestHandler, str, str, dict], None]):
    peer = Peer(routes)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.peer = peer
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    peer.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield peer
    finally:
        peer.quit.set()
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reply(h: BaseHTTPRequestHandler, status: int, body: bytes | str | Any,
          kind: str = "application/json") -> None:
    data = body if isinstance(body, bytes) else (
        body.encode() if isinstance(body, str) else json.dumps(body).encode())
    h.send_response(status)
    h.send_header("Content-Type", kind)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def start_stream(h: BaseHTTPRequestHandler, chunked: bool = True) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream; charset=utf-8")
    if chunked:
        h.send_header("Transfer-Encoding", "chunked")
    else:
        h.send_header("Connection", "close")  # the body ends when the connection closes
        h.close_connection = True
    h.end_headers()


def chunk(h: BaseHTTPRequestHandler, data: bytes, chunked: bool = True) -> None:
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def token(i: int, finish: str | None = None, text: str | None = None) -> bytes:
    return event({"choices": [{"index": 0, "text": text if text is not None else chr(97 + i % 26),
                               "token_ids": [100 + i], "finish_reason": finish}]})


def end_stream(h: BaseHTTPRequestHandler, prompt_tokens: int = 3) -> None:
    chunk(h, event({"choices": [], "usage": {"prompt_tokens": prompt_tokens}}))
    chunk(h, b"data: [DONE]\n\n")
    h.wfile.write(b"0\r\n\r\n")


def hang_up(h: BaseHTTPRequestHandler) -> None:
    """Close the TCP connection mid-body (no terminating chunk)."""
    h.close_connection = True
    h.wfile.flush()
    h.connection.shutdown(socket.SHUT_RDWR)


def openai(completions: Callable[[BaseHTTPRequestHandler, dict], None],
           metrics: Callable[[BaseHTTPRequestHandler], None] | None = None,
           models: tuple[str, ...] = (MODEL,)):
    """Routes of an OpenAI-compatible server whose POST /v1/completions is `completions`."""
    def routes(h: BaseHTTPRequestHandler, method: str, path: str, body: dict) -> None:
        if method == "GET" and path == "/v1/models":
            reply(h, 200, {"object": "list", "data": [{"id": m, "object": "model"}
                                                      for m in models]})
        elif method == "GET" and path == "/metrics":
            if metrics is None:
                reply(h, 200, METRICS, "text/plain; version=0.0.4")
            else:
                metrics(h)
        elif method == "POST" and path == "/v1/completions":
            completions(h, body)
        else:
            reply(h, 404, {"detail": "Not Found"})
    return routes


def well_behaved(h: BaseHTTPRequestHandler, body: dict, delay_s: float = 0.0) -> None:
    start_stream(h)
    n = int(body["max_tokens"])
    for i in range(n):
        time.sleep(delay_s)
        chunk(h, token(i, "length" if i == n - 1 else None))
    end_stream(h)


def config(url: str, prompts: tuple[str, ...] = ("hello",), requests: int = 1,
           max_new_tokens: int = 4, concurrency: int = 4, model: str = MODEL) -> LoadConfig:
    return LoadConfig(url, model, prompts, requests, max_new_tokens, concurrency,
                      chat_template=False)


def run_load(cfg: LoadConfig, within_s: float = 20.0, poll_s: float = 0.1) -> LoadRun:
    """The finished run, or a failure if the load does not end within `within_s` (a scripted
    peer's counters are set before its answer: no settling before the last scrape)."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["run"] = LoadTest(cfg, poll_s=poll_s, settle_s=0.0).run_all()
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            box["error"] = error

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(within_s)
    assert not thread.is_alive(), f"the load did not end within {within_s} s"
    if "error" in box:
        raise box["error"]
    return box["run"]


def one_sentence(message: str) -> None:
    assert message and "\n" not in message and len(message) < 400, message
    assert "Traceback" not in message and "object at 0x" not in message, message


def round_trips(run: LoadRun) -> None:
    """Whatever the client recorded, it can save and load back unchanged."""
    assert load_loadtest(load_to_bytes(run)) == run
