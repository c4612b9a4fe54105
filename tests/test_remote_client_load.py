"""engine/remote's load test against hostile peers (the servers of tests/test_remote_client.py):
what a run keeps when the stream or /metrics misbehaves (and whether it saves and loads back),
Stop, snapshots, and the timing definitions.

The timing test scripts chunk delays (50 ms apart) and checks the metric definitions of
engine/remote/record.py against them with generous tolerances: correctness, not speed.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

import engine.remote.loadtest
from engine.remote.client import StreamResult
from engine.remote.loadtest import LoadTest
from engine.remote.record import LoadRun
from tests.remote_peers import (
    METRICS,
    chunk,
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
from tests.test_remote_client import HTML, scripted

# --- what a hostile stream records must save and load back --------------------------------------

RECORDED_FAULTS = {
    "more tokens than asked, one per event": tuple(token(i) for i in range(40)),
    "more tokens than asked, in one event": (event({"choices": [{
        "text": "x" * 40, "token_ids": list(range(40)), "finish_reason": "length"}]}),),
    "negative token id": (event({"choices": [{"text": "a", "token_ids": [-7],
                                              "finish_reason": "length"}]}),),
    "token id 2**70": (event({"choices": [{"text": "a", "token_ids": [2**70],
                                           "finish_reason": "length"}]}),),
    "negative prompt tokens": (token(0, "length"),
                               event({"choices": [], "usage": {"prompt_tokens": -5}}),
                               b"data: [DONE]\n\n"),
    "prompt token id 2**63": (event({"choices": [{"text": "a", "token_ids": [1],
                                                  "prompt_token_ids": [2**63],
                                                  "finish_reason": "length"}]}),),
    "lone surrogate in the text": (b'data: {"choices": [{"text": "\\ud800", "token_ids": [5], '
                                   b'"finish_reason": "length"}]}\n\n',),
}


@was_bug("the client keeps what the file reader refuses (tokens beyond max_tokens, ids outside "
     "0..2**31, negative counts) or cannot write (lone surrogates)")
@pytest.mark.parametrize("case", list(RECORDED_FAULTS))
def test_what_a_hostile_stream_leaves_in_the_run_saves_and_loads_back(case):
    """The page saves every run; a run the client accepted must not be a file the app refuses
    (or fails to write): either the client refuses the data as that request's error, or the
    file keeps it."""
    with serve(openai(scripted(*RECORDED_FAULTS[case]))) as peer:
        run = run_load(config(peer.url, max_new_tokens=8))
    (r,) = run.requests
    assert r.output_tokens <= 8 and len(r.token_ids) <= 8
    round_trips(run)


# --- /metrics ------------------------------------------------------------------------------------

@pytest.mark.parametrize("metrics, expected", [
    (lambda h: reply(h, 404, {"detail": "Not Found"}), "HTTP 404"),
    (lambda h: reply(h, 200, HTML, "text/html"), "not Prometheus text"),
    (lambda h: reply(h, 200, b"\xff\xfe garbage \x00\x01 42", "text/plain"), "not Prometheus"),
    (hang_up, "/metrics"),
])
def test_a_missing_or_garbled_metrics_page_is_noted_once_and_the_load_completes(metrics,
                                                                                expected):
    with serve(openai(well_behaved, metrics)) as peer:
        run = run_load(config(peer.url, requests=2))
    assert [r.finish for r in run.requests] == ["length", "length"] and run.error is None
    assert run.samples == ()
    one_sentence(run.metrics_error)
    assert run.metrics_error.startswith("no server metrics: ") and expected in run.metrics_error
    round_trips(run)


def test_metrics_that_fail_later_keep_the_first_error_and_the_samples_before():
    calls = {"n": 0}

    def metrics(h):
        calls["n"] += 1
        if calls["n"] <= 2:
            reply(h, 200, METRICS, "text/plain")
        else:
            reply(h, 500 + calls["n"], {"error": {"message": f"scrape {calls['n']}"}})

    def slow(h, body):
        well_behaved(h, body, delay_s=0.1)

    with serve(openai(slow, metrics)) as peer:
        run = run_load(config(peer.url, max_new_tokens=6))
    assert len(run.samples) == 2 and run.samples[0].kv_usage == 0.25
    assert run.metrics_error.endswith("scrape 3")  # the first failure, not the last


@was_bug("fetch_metrics_text has a per-read timeout only: a trickle holds the load for ever")
def test_a_trickling_metrics_page_does_not_hold_up_the_load(monkeypatch):
    """/metrics that sends one byte every 0.2 s for ever (never a read timeout): the load must
    still end, with a metrics error. The load's reads of /metrics end after 0.5 s here (their
    overall timeout, 2 s by default, is what is tested, not its value)."""
    monkeypatch.setattr(engine.remote.loadtest, "fetch_metrics_text",
                        functools.partial(engine.remote.loadtest.fetch_metrics_text, timeout=0.5))

    def metrics(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        while not h.server.peer.quit.wait(0.2):
            chunk(h, b"#")
        hang_up(h)  # the test is over: free the client's thread

    with serve(openai(well_behaved, metrics)) as peer:
        run = run_load(config(peer.url), within_s=8)
    assert run.requests[0].finish == "length" and run.metrics_error


@pytest.mark.parametrize("text", [
    METRICS.replace("0.25", "NaN"),
    METRICS.replace("0.25", "1.5"),
    METRICS.replace("1.0", "-1.0"),
    METRICS + "# TYPE vllm:generation_tokens_total counter\n"
              'vllm:generation_tokens_total{model_name="toy"} 3.5e9\n',
    METRICS + "# TYPE vllm:prefix_cache_queries_total counter\n"
              'vllm:prefix_cache_queries_total{model_name="toy"} 1e12\n',
    METRICS + "# TYPE vllm:cache_config_info gauge\n"
              'vllm:cache_config_info{block_size="16",num_gpu_blocks="0"} 1.0\n',
    METRICS + "# TYPE vllm:cache_config_info gauge\n"
              'vllm:cache_config_info{block_size="16",num_gpu_blocks="99999999999"} 1.0\n',
], ids=["kv NaN", "kv 1.5", "running -1", "3.5e9 tokens generated", "1e12 prefix queries",
        "a pool of 0 blocks", "a pool of 10^11 blocks"])
@was_bug("samples keep NaN, negative gauges, KV usage > 1, counters > 86.4e6 and pool sizes the "
     "file reader refuses")
def test_what_a_metrics_page_leaves_in_the_run_saves_and_loads_back(text):
    """A long-lived production server's counters pass 86.4 million (the file's bound for a time
    in ms) within hours; a gauge can be NaN. The sample is either dropped with a metrics error
    or kept in a file that loads."""
    with serve(openai(well_behaved, lambda h: reply(h, 200, text, "text/plain"))) as peer:
        run = run_load(config(peer.url))
    round_trips(run)


# --- Stop ---------------------------------------------------------------------------------------

def test_stop_during_a_slow_stream_keeps_the_partial_run():
    def completions(h, body):
        well_behaved(h, body, delay_s=0.15)

    with serve(openai(completions)) as peer:
        test = LoadTest(config(peer.url, requests=3, max_new_tokens=30, concurrency=1),
                        poll_s=0.1)
        run, at_stop = None, None
        started = time.perf_counter()
        for run in test:
            if run.requests[0].output_tokens >= 3 and at_stop is None:
                at_stop = run.requests[0].output_tokens
                test.stop()
            assert time.perf_counter() - started < 20
    first, *unsent = run.requests
    assert run.stopped and run.error is None
    # the stream ends at its next chunk (150 ms apart), not when the server is done
    assert first.finish == "stopped" and at_stop <= first.output_tokens <= at_stop + 3
    assert len(first.chunk_ms) == first.output_tokens and len(first.text) == first.output_tokens
    assert [(r.finish, r.sent_ms, r.chunk_ms) for r in unsent] == [("stopped", None, ())] * 2
    round_trips(run)


def test_stop_during_a_stalled_stream_ends_the_load_promptly():
    """A stream that goes silent (the server hangs): Stop must not wait for the 120 s read
    timeout."""
    def completions(h, body):
        start_stream(h)
        chunk(h, token(0))
        h.server.peer.quit.wait(60)

    with serve(openai(completions)) as peer:
        test = LoadTest(config(peer.url, requests=2, max_new_tokens=8, concurrency=1),
                        poll_s=0.1)
        box: dict[str, LoadRun] = {}
        thread = threading.Thread(target=lambda: box.setdefault("run", test.run_all()),
                                  daemon=True)
        thread.start()
        deadline = time.perf_counter() + 10
        while time.perf_counter() < deadline and not test.snapshot().requests[0].chunk_ms:
            time.sleep(0.05)
        test.stop()
        thread.join(5)
        assert not thread.is_alive(), "Stop did not end a stalled stream within 5 s"
    run = box["run"]
    assert run.stopped and run.requests[0].finish == "stopped"
    assert run.requests[0].output_tokens == 1 and run.requests[1].finish == "stopped"


@was_bug("snapshot() builds a RemoteRequest from chunk_s and chunk_tokens of different lengths")
def test_a_snapshot_taken_between_a_chunk_s_time_and_its_count_is_consistent():
    """The stream thread appends a chunk's time, then its token count; a page's snapshot can run
    in between."""
    test = LoadTest(config("http://127.0.0.1:1/v1"))
    test._t0 = time.perf_counter()
    result: StreamResult = test._results[0]
    result.sent_s = test._t0
    result.chunk_s.append(test._t0 + 0.01)  # the time is there, the count not yet
    snap = test.snapshot()
    assert len(snap.requests[0].chunk_ms) == len(snap.requests[0].chunk_tokens)


# --- the timing definitions ---------------------------------------------------------------------

@pytest.mark.parametrize("chunked", [True, pytest.param(False, marks=was_bug(
    "iter_lines(chunk_size=None) on a body without chunked encoding reads to the end before "
    "yielding: every chunk gets the last chunk's time"))], ids=["chunked", "close-delimited"])
def test_client_timings_follow_the_scripted_delays(chunked):
    """First token 200 ms after the request, then one every 50 ms: TTFT ≈ 200, each ITL ≈ 50,
    E2E ≈ 200 + 4·50, TPOT = (last − first)/(n − 1) ≈ 50, throughput = 5 tokens / E2E."""
    first_s, gap_s, n = 0.2, 0.05, 5

    def completions(h, body):
        start_stream(h, chunked)
        for i in range(n):
            time.sleep(first_s if i == 0 else gap_s)
            chunk(h, token(i, "length" if i == n - 1 else None), chunked)
        if chunked:
            end_stream(h)
        else:
            chunk(h, b"data: [DONE]\n\n", chunked)

    with serve(openai(completions)) as peer:
        run = run_load(config(peer.url, max_new_tokens=n))
    (r,) = run.requests
    assert r.finish == "length" and r.output_tokens == n
    # The server's sleeps are lower bounds; a stall on this shared 2-core machine only adds (to
    # one gap, or shifts time between neighbours), so upper bounds are generous and single gaps
    # are checked through their median: the point is the definitions, not the speed.
    assert 1000 * first_s - 5 <= r.ttft_ms <= 1000 * first_s + 150
    assert len(r.itl_ms) == n - 1
    assert float(np.median(r.itl_ms)) == pytest.approx(1000 * gap_s, abs=20), r.itl_ms
    e2e = 1000 * (first_s + (n - 1) * gap_s)
    assert e2e - 5 <= r.e2e_ms <= e2e + 200
    assert r.tpot_ms == pytest.approx((r.chunk_ms[-1] - r.chunk_ms[0]) / (n - 1))
    assert 1000 * gap_s - 5 <= r.tpot_ms <= 1000 * gap_s + 50
    assert r.e2e_ms == pytest.approx(r.ttft_ms + sum(r.itl_ms))
    assert run.duration_ms == pytest.approx(r.chunk_ms[-1] - r.sent_ms)
    assert run.throughput_tok_s == pytest.approx(1000 * n / r.e2e_ms)
    assert run.throughput_tok_s == pytest.approx(n / (first_s + (n - 1) * gap_s), rel=0.4)
