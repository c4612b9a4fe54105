"""The Serving engine page's figures (charts/remote.py) from hand-built load-test records: no
server, no model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from charts.live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR
from charts.present import PROJECTOR, presentation
from charts.remote import (
    ERROR,
    QUEUE_COLOR,
    STOPPED,
    TIME_AXIS,
    WAITING_COLOR,
    gantt_chart,
    load_at,
    now_ms,
    request_spans,
    server_chart,
    server_rate,
    throughput_chart,
)
from engine.remote.record import Histogram, LoadConfig, LoadRun, MetricsSample, RemoteRequest

INF = math.inf


def sample(t: float, running: float, waiting: float, kv: float, gen: float, pre: float = 0.0
           ) -> MetricsSample:
    hist = Histogram((0.1, 0.5, INF), (0.0, 0.0, 0.0), 0.0, 0.0)
    return MetricsSample(t, running, waiting, kv, pre, 10.0, 0.0, None, None, gen, hist, hist)


def request(i: int, sent: float | None, chunks: tuple[float, ...], finish: str,
            error: str | None = None) -> RemoteRequest:
    return RemoteRequest(i, f"prompt {i}", sent, chunks, (1,) * len(chunks),
                         tuple(range(len(chunks))), "x" * len(chunks), 5, finish, error)


def make_run(**changes) -> LoadRun:
    """Four requests, at most two in flight: 0 and 1 sent at once (1 fails after two tokens),
    2 sent when 1 ended and still streaming, 3 not sent yet."""
    config = LoadConfig("http://127.0.0.1:8011/v1", "m", ("a", "b"), 4, 8, 2)
    requests = (request(0, 0.0, (200.0, 300.0, 400.0), "length"),
                request(1, 0.0, (250.0, 350.0), "error", "the server closed the stream"),
                request(2, 350.0, (600.0,), "running"),
                request(3, None, (), "waiting"))
    samples = (sample(0.0, 0, 0, 0.0, 100), sample(500.0, 2, 1, 0.02, 104, pre=0),
               sample(1000.0, 1, 0, 0.01, 106, pre=1))
    base = dict(config=config, server="m", requests=requests, samples=samples,
                created="2026-12-03T00:00:00+00:00")
    return LoadRun(**{**base, **changes})


def by_name(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_the_gantt_draws_each_phase_in_seconds_with_the_house_colours():
    run = make_run()
    fig = gantt_chart(run)
    assert now_ms(run) == 1000.0  # the last /metrics sample is the live view's "now"
    waiting = by_name(fig, "waiting to be sent")
    ttft = by_name(fig, "sent → first token (TTFT)")
    decode = by_name(fig, "decode")
    assert (waiting.marker.color, ttft.marker.color, decode.marker.color) == (
        QUEUE_COLOR, PREFILL_COLOR, DECODE_COLOR)
    # request 2 waited for a slot 0 → 0.35 s; request 3 (unsent) waits until now (1 s)
    assert list(waiting.y) == ["request 2", "request 3"]
    assert list(waiting.base) == [0.0, 0.0] and list(waiting.x) == pytest.approx([0.35, 1.0])
    assert list(ttft.y) == ["request 0", "request 1", "request 2"]
    assert list(ttft.x) == pytest.approx([0.2, 0.25, 0.25])  # first token − sent, in s
    # a running request's decode bar reaches now; a finished one ends at its last token
    spans = dict(zip(decode.y, zip(decode.base, decode.x)))
    assert spans["request 0"] == pytest.approx((0.2, 0.2))
    assert spans["request 2"] == pytest.approx((0.6, 0.4))
    assert "TTFT, client" in ttft.hovertext[0] and "prompt 0" in ttft.hovertext[0]
    done, error = by_name(fig, "done"), by_name(fig, "error")
    assert list(done.y) == ["request 0"] and list(done.x) == [0.4]
    assert list(error.y) == ["request 1"] and error.marker.color == ERROR
    assert "closed the stream" in error.hovertext[0]
    assert fig.layout.xaxis.title.text == TIME_AXIS == "time since the load started (s)"
    assert list(fig.layout.yaxis.categoryarray) == [f"request {i}" for i in range(4)]
    assert fig.layout.yaxis.autorange == "reversed"


def test_stopped_requests_are_marked_and_an_error_without_tokens_has_no_ttft_bar():
    stopped = request(0, 0.0, (), "stopped")
    assert request_spans(stopped, 0.0, 900.0)["ttft"] == (0.0, 900.0)
    failed = request(1, 100.0, (), "error", "HTTP 400: bad")
    assert request_spans(failed, 0.0, 900.0) == {"waiting": (0.0, 100.0), "ttft": None,
                                                  "decode": None}
    run = make_run(requests=(stopped, failed, request(2, None, (), "stopped"),
                             request(3, 0.0, (10.0,), "stop")), stopped=True)
    fig = gantt_chart(run)
    marks = by_name(fig, "stopped")
    assert list(marks.y) == ["request 0", "request 2"] and marks.marker.color == STOPPED
    assert marks.marker.symbol == "circle-open"
    assert list(by_name(fig, "error").x) == [0.1]  # marked where it was sent


def test_tokens_per_second_client_window_server_counter_and_mean():
    run = make_run()
    fig = throughput_chart(run)
    client = fig.data[0]
    assert client.line.color == DECODE_COLOR and client.name.startswith("client")
    # chunks at 0.2, 0.25, 0.3, 0.35, 0.4, 0.6 s: the 1-s window ending at 0.75 s holds all six
    assert dict(zip(client.x, client.y))[0.75] == pytest.approx(6.0)
    server = fig.data[1]
    assert server_rate(run.samples) == [(500.0, 8.0), (1000.0, 4.0)]  # counter Δ ÷ Δt
    assert list(server.x) == [0.5, 1.0] and list(server.y) == [8.0, 4.0]
    assert run.throughput_tok_s == pytest.approx(1000 * 6 / 600)  # tokens ÷ (last − first sent)
    line = fig.layout.shapes[0]
    assert line.y0 == line.y1 == pytest.approx(10.0)
    assert fig.layout.annotations[0].text == "mean so far: 10.0 tokens/s"  # request 2 streams
    over = make_run(requests=(*run.requests[:2], replace(run.requests[2], finish="length"),
                              replace(run.requests[3], finish="stopped")))
    assert throughput_chart(over).layout.annotations[0].text == "mean over the load: 10.0 tokens/s"
    assert fig.layout.xaxis.title.text == TIME_AXIS
    assert fig.layout.yaxis.title.text == "output tokens/s"


def test_server_gauges_running_waiting_kv_percent_and_preemptions():
    run = make_run()
    fig = server_chart(run)
    running = by_name(fig, "running (in the server's batch)")
    waiting = by_name(fig, "waiting (queued in the server)")
    kv = by_name(fig, "KV-cache usage")
    assert list(running.x) == [0.0, 0.5, 1.0] and list(running.y) == [0, 2, 1]
    assert list(waiting.y) == [0, 1, 0] and waiting.marker.color is None
    assert waiting.line.color == WAITING_COLOR and running.line.shape == "hv"
    assert list(kv.y) == pytest.approx([0.0, 2.0, 1.0])  # a fraction shown as %
    assert kv.line.color == KV_COLOR and kv.yaxis == "y2"
    preempt = by_name(fig, "preemption(s)")
    assert list(preempt.x) == [1.0] and list(preempt.customdata) == [1]
    assert fig.layout.yaxis.title.text == "requests"
    assert fig.layout.yaxis2.title.text == "KV usage (% of blocks)"
    assert fig.layout.yaxis2.range == pytest.approx((0, 2.5))
    assert fig.layout.xaxis2.title.text == TIME_AXIS
    assert "% of the KV-cache blocks" in kv.hovertemplate
    empty = server_chart(make_run(samples=()))
    assert empty.layout.annotations[-1].text == "no /metrics samples from this server"


def test_colours_have_projector_equivalents():
    for fig in (gantt_chart(make_run()), throughput_chart(make_run()), server_chart(make_run())):
        shown = presentation(fig)
        for trace, original in zip(shown.data, fig.data):
            colour = original.marker.color if original.type == "bar" else original.line.color
            if isinstance(colour, str) and colour != "#000000":
                assert colour.lower() in PROJECTOR, (trace.name, colour)


def test_a_replay_frame_shows_the_load_as_it_stood():
    run = make_run(requests=(request(0, 0.0, (200.0, 300.0, 400.0), "length"),
                             request(1, 0.0, (), "error", "HTTP 500: x"),
                             request(2, 350.0, (600.0,), "stop")))
    run = make_run(config=LoadConfig("http://h/v1", "m", ("a",), 3, 8, 2),
                   requests=run.requests)
    frame = load_at(run, 320.0)
    r0, r1, r2 = frame.requests
    assert r0.chunk_ms == (200.0, 300.0) and r0.finish == "running" and r0.token_ids == (0, 1)
    assert r1.finish == "error"  # failed without tokens: ended when sent
    assert r2.sent_ms is None and r2.finish == "waiting"
    assert [s.t_ms for s in frame.samples] == [0.0]
    assert load_at(run, 10_000.0).requests == run.requests
