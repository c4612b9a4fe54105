"""engine/remote against hostile peers: tiny real HTTP servers written here (not mocks of vLLM) that
do what a bad or broken server does — nothing listening, the wrong models, HTML everywhere, a
stream cut short, error bodies, malformed or endless events, a missing or trickling /metrics, a
stalled stream the user stops. Each must end in one RemoteError sentence before the load, or in
one per-request error with the partial tokens kept, and the run must save and load back.

The servers here are shared with tests/test_remote_client_load.py (what a run keeps: metrics,
Stop, the saved file, the timing definitions).
"""

from __future__ import annotations

import time

import pytest

from engine.remote.client import (
    MAX_EVENT_BYTES,
    RemoteError,
    list_models,
    normalize_base_url,
)
from tests.remote_peers import (
    chunk,
    closed_port,
    config,
    end_stream,
    event,
    hang_up,
    one_sentence,
    openai,
    reply,
    round_trips,
    run_load,
    serve,
    start_stream,
    token,
    was_bug,
    well_behaved,
)

# --- base URLs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("given, expected", [
    ("http://127.0.0.1:8011", "http://127.0.0.1:8011/v1"),
    ("http://127.0.0.1:8011/", "http://127.0.0.1:8011/v1"),
    ("  https://example.org:443/v1/  ", "https://example.org:443/v1"),
    ("http://host/openai/v1", "http://host/openai/v1"),
    ("HTTP://Host:08011", "http://host:8011/v1"),
    ("http://[::1]:8011/v1", "http://[::1]:8011/v1"),
])
def test_normalize_base_url_adds_v1_only_when_there_is_no_path(given, expected):
    assert normalize_base_url(given) == expected


@pytest.mark.parametrize("bad", ["ftp://host/v1", "file:///etc/passwd", "127.0.0.1:8011",
                                 "localhost:8011/v1", "http://", "http:///v1", "", "   ",
                                 "javascript:alert(1)", "http//host",
                                 "http://host:8011/v1?x=1#y"])
def test_normalize_base_url_refuses_what_is_not_an_http_url_in_one_sentence(bad):
    with pytest.raises(RemoteError) as caught:
        normalize_base_url(bad)
    one_sentence(str(caught.value))
    assert "http" in str(caught.value)


# --- unusable servers: one sentence before the load ---------------------------------------------

def test_an_unreachable_url_is_one_sentence_from_list_models_and_the_load():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(RemoteError) as caught:
        list_models(url)
    one_sentence(str(caught.value))
    assert "cannot reach" in str(caught.value)
    with pytest.raises(RemoteError) as caught:
        run_load(config(url))
    one_sentence(str(caught.value))
    assert "cannot reach" in str(caught.value)


def test_a_server_that_never_answers_is_one_sentence_after_the_timeout():
    def silent(h, method, path, body):
        h.server.peer.quit.wait(30)

    with serve(silent) as peer:
        started = time.perf_counter()
        with pytest.raises(RemoteError) as caught:
            list_models(peer.url, timeout=0.5)
        assert time.perf_counter() - started < 10
    one_sentence(str(caught.value))
    assert "timed out" in str(caught.value)


def test_a_wrong_model_names_what_the_server_serves():
    with serve(openai(well_behaved, models=("alpha", "beta"))) as peer:
        with pytest.raises(RemoteError) as caught:
            run_load(config(peer.url, model="gamma"))
        message = str(caught.value)
        one_sentence(message)
        assert "'gamma'" in message and "alpha" in message and "beta" in message
        assert run_load(config(peer.url, model="")).server == "alpha"  # none given: the first


def test_a_server_that_serves_no_model_says_so():
    with serve(openai(well_behaved, models=())) as peer, pytest.raises(RemoteError) as caught:
        run_load(config(peer.url))
    one_sentence(str(caught.value))
    assert "serves no model" in str(caught.value)


HTML = ("<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n"
        "<body><h1>Welcome to nginx!</h1><p>If you see this page, the web server works.</p>"
        "</body></html>\n")


@pytest.mark.parametrize("status", [200, pytest.param(404, marks=was_bug(
    "a non-200 HTML answer to GET /models is pasted into the message as markup"))])
def test_a_non_openai_server_does_not_look_like_one(status):
    """An ordinary web server (HTML at every path, found or not): one sentence, no markup."""
    def routes(h, method, path, body):
        reply(h, status, HTML, "text/html")

    with serve(routes) as peer:
        for call in (lambda: list_models(peer.url), lambda: run_load(config(peer.url))):
            with pytest.raises(RemoteError) as caught:
                call()
            message = str(caught.value)
            one_sentence(message)
            assert "does not look like an OpenAI-compatible server" in message
            assert "<" not in message, message


@was_bug("_error_message calls .get on a string `error` (AttributeError escapes)")
def test_a_server_that_wants_an_api_key_says_so():
    """vLLM started with --api-key answers 401 {"error": "Unauthorized"} (a string, not an
    object), as TGI does for its errors."""
    def routes(h, method, path, body):
        reply(h, 401, {"error": "Unauthorized"})

    with serve(routes) as peer, pytest.raises(RemoteError) as caught:
        list_models(peer.url)
    one_sentence(str(caught.value))
    assert "401" in str(caught.value) and "Unauthorized" in str(caught.value)


@was_bug("list_models reads the whole body, however large")
def test_an_endless_model_list_is_not_read_to_the_end():
    """GET /v1/models that never stops sending: the client gives up, it does not buffer it all."""
    total = 48 << 20

    def routes(h, method, path, body):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(total))
        h.end_headers()
        h.wfile.write(b'{"data": [')
        sent, block = 10, b" " * (1 << 20)
        while sent < total and not h.server.peer.quit.is_set():
            h.wfile.write(block)
            sent += len(block)
            h.server.peer.sent["models"] = sent

    with serve(routes) as peer:
        with pytest.raises(RemoteError) as caught:
            list_models(peer.url)
        one_sentence(str(caught.value))
        assert peer.sent.get("models", 0) < total // 2, "the client read the whole body"


# --- a stream cut short, errors per request ------------------------------------------------------

def cut_after(k: int, chunked: bool = True):
    """POST /v1/completions: prompt "cut" gets k tokens, then the connection closes; others are
    served in full."""
    def completions(h, body):
        if body.get("prompt") != "cut":
            return well_behaved(h, body)
        start_stream(h, chunked)
        for i in range(k):
            chunk(h, token(i), chunked)
        hang_up(h)
    return completions


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
def test_a_stream_cut_short_keeps_its_tokens_and_spares_the_others(chunked):
    k = 3
    with serve(openai(cut_after(k, chunked))) as peer:
        run = run_load(config(peer.url, ("cut", "fine"), requests=2, max_new_tokens=6))
    cut, fine = run.requests
    assert cut.finish == "error" and cut.output_tokens == k and len(cut.chunk_ms) == k
    assert cut.chunk_tokens == (1,) * k and cut.text == "abc" and cut.token_ids == (100, 101, 102)
    one_sentence(cut.error)
    assert "closed" in cut.error or "ended" in cut.error, cut.error
    assert f"{k} tokens" in cut.error
    assert fine.finish == "length" and fine.output_tokens == 6 and fine.error is None
    assert run.error is None  # the load ran; one request failed
    round_trips(run)


def test_a_connection_closed_before_any_token_is_one_error():
    def completions(h, body):
        hang_up(h)

    with serve(openai(completions)) as peer:
        run = run_load(config(peer.url, requests=2))
    assert all(r.finish == "error" and r.output_tokens == 0 for r in run.requests)
    one_sentence(run.requests[0].error)
    assert run.error == run.requests[0].error  # nothing came back at all: the load's error too
    round_trips(run)


@pytest.mark.parametrize("status, body, expected", [
    (400, {"error": {"message": "This model's maximum context length is 2048 tokens.",
                     "type": "BadRequestError", "code": 400}}, "maximum context length"),
    (404, {"object": "error", "message": "The model `toy` does not exist.",
           "type": "NotFoundError", "code": 404}, "does not exist"),
    (500, {"error": {"message": "CUDA out of memory\n  at line 3", "type": "InternalError"}},
     "CUDA out of memory at line 3"),
    pytest.param(422, {"error": "Input validation error: max_new_tokens must be <= 512"},
                 "max_new_tokens", marks=was_bug("a string `error` raises AttributeError in the "
                                             "stream thread; the request stays running")),
    (503, "<html><body>Service Unavailable</body></html>", "Service Unavailable"),
])
def test_an_http_error_answer_is_that_request_s_message(status, body, expected):
    def completions(h, request):
        if request.get("prompt") == "bad":
            reply(h, status, body, "application/json" if isinstance(body, dict) else "text/html")
        else:
            well_behaved(h, request)

    with serve(openai(completions)) as peer:
        run = run_load(config(peer.url, ("bad", "fine"), requests=2))
    bad, fine = run.requests
    assert bad.finish == "error" and bad.output_tokens == 0
    one_sentence(bad.error)
    assert bad.error.startswith(f"HTTP {status}") and expected in bad.error, bad.error
    assert fine.finish == "length"


def scripted(*events: bytes):
    """POST /v1/completions streams `events` (one HTTP chunk each), then usage and [DONE] unless
    the events sent [DONE] themselves."""
    def completions(h, body):
        start_stream(h)
        for data in events:
            chunk(h, data)
        if events and events[-1].startswith(b"data: [DONE]"):
            h.wfile.write(b"0\r\n\r\n")
        else:
            end_stream(h)
    return completions


STREAM_FAULTS = {
    "not JSON": ((token(0), token(1), b"data: {oops\n\n"), "not an OpenAI stream event", 2),
    "JSON but not an object": ((token(0), b"data: [1, 2]\n\n"), "not a JSON object", 1),
    "error event": ((token(0), token(1), token(2),
                     event({"error": {"message": "engine died", "code": 500}})),
                    "the server reported: engine died", 3),
    "error event as text": ((event({"error": "overloaded"}),), "the server reported: overloaded",
                            0),
    "oversized event": ((token(0), b"data: " + b"x" * (MAX_EVENT_BYTES + 10) + b"\n\n"),
                        "oversized", 1),
    "no finish reason": ((token(0), token(1)), "without a finish reason after 2 tokens", 2),
}


@pytest.mark.parametrize("case", list(STREAM_FAULTS))
def test_a_bad_event_ends_that_request_and_keeps_what_came(case):
    events, expected, kept = STREAM_FAULTS[case]
    with serve(openai(scripted(*events))) as peer:
        run = run_load(config(peer.url, max_new_tokens=8))
    (r,) = run.requests
    assert r.finish == "error" and expected in r.error, r.error
    one_sentence(r.error)
    assert r.output_tokens == kept and len(r.chunk_ms) == kept
    round_trips(run)


@was_bug("iter_lines buffers a line of any length before the MAX_EVENT_BYTES check")
def test_an_endless_line_is_not_buffered_to_the_end():
    """An event that never ends (no newline): the client stops reading soon after
    MAX_EVENT_BYTES, rather than gathering the whole body (and re-copying it per chunk)."""
    total = 48 << 20

    def completions(h, body):
        start_stream(h)
        chunk(h, token(0))
        sent, block = 0, b"x" * (1 << 20)
        h.wfile.write(b"%x\r\n" % total)  # one HTTP chunk of 48 MB, sent 1 MB at a time
        while sent < total and not h.server.peer.quit.is_set():
            h.wfile.write(block)
            sent += len(block)
            h.server.peer.sent["line"] = sent
        h.wfile.write(b"\r\n")
        end_stream(h)

    with serve(openai(completions)) as peer:
        run = run_load(config(peer.url, max_new_tokens=4), within_s=60)
        sent = peer.sent.get("line", 0)
    (r,) = run.requests
    assert r.finish == "error" and "oversized" in r.error and r.output_tokens == 1
    assert sent < total // 2, f"the client read {sent >> 20} MB of one line"


@was_bug("_error_message reads the whole error body, however large")
def test_an_endless_error_body_is_not_read_to_the_end():
    total = 48 << 20

    def completions(h, body):
        h.send_response(500)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(total))
        h.end_headers()
        sent, block = 0, b"e" * (1 << 20)
        while sent < total and not h.server.peer.quit.is_set():
            h.wfile.write(block)
            sent += len(block)
            h.server.peer.sent["error"] = sent

    with serve(openai(completions)) as peer:
        run = run_load(config(peer.url), within_s=60)
        sent = peer.sent.get("error", 0)
    assert run.requests[0].finish == "error" and run.requests[0].error.startswith("HTTP 500")
    assert sent < total // 2, f"the client read {sent >> 20} MB of an error page"
