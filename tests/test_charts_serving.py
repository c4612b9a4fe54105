"""The Serving page's figures (charts/serving.py) from hand-built serving records: no model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from charts.live import DECODE_COLOR, PREFILL_COLOR
from charts.present import PROJECTOR, presentation, projector_color
from charts.serving import (
    QUEUE_COLOR,
    REQUEST_COLORS,
    SHARED_PATTERN,
    TIME_AXIS,
    batching_chart,
    block_grid_chart,
    drafted_chips_html,
    gantt_chart,
    per_request_chart,
    request_color,
    sharing_chart,
    speculation_chart,
    throughput_chart,
)
from engine.serving.metrics import summarize_stream, tokens_per_step
from engine.serving.record import (
    BlockTableRow,
    RequestRecord,
    RequestSpec,
    ServingConfig,
    ServingRun,
    StepRecord,
)


def _request(i, prompt, arrival, admitted, token_ms, steps, finish="length", cached=0):
    spec = RequestSpec(f"prompt {i}", tuple(range(1, prompt + 1)), max(len(token_ms), 1), arrival)
    return RequestRecord(i, spec, admitted, tuple(range(len(token_ms))), tuple(token_ms),
                         tuple(steps), "x" * len(token_ms), cached, 0, finish)


def _run(scheduler="continuous", sharing=True, step_ms=10.0):
    """Three requests, block size 4, pool of 12: 0 and 1 share their first block (a common
    prefix of 4 tokens); 2 arrives at 15 ms and waits for a slot (max batch 2) until 0 ends."""
    config = ServingConfig(scheduler, max_batch=2, block_size=4, num_blocks=12,
                           prefix_sharing=sharing)
    r0 = _request(0, 6, 0.0, 0.0, [10.0, 20.0, 30.0], [0, 1, 2])
    r1 = _request(1, 5, 0.0, 0.0, [10.0, 20.0, 30.0, 40.0], [0, 1, 2, 3], cached=4 if sharing else 0)
    r2 = _request(2, 3, 15.0, 30.0, [40.0], [3], finish="eos")
    shared = 0 if sharing else 3
    steps = (
        StepRecord(0, 0.0, step_ms, "prefill", (0, 1), (6, 1 if sharing else 5),
                   (BlockTableRow(0, (0, 1), 7), BlockTableRow(1, (0, 2), 6)) if sharing else
                   (BlockTableRow(0, (0, 1), 7), BlockTableRow(1, (3, 2), 6)), 9, 1 - shared // 3, 0, 0),
        StepRecord(1, 10.0, step_ms, "decode", (0, 1), (1, 1),
                   (BlockTableRow(0, (0, 1), 8), BlockTableRow(1, (0, 2), 7)), 9, 1, 0, 1),
        StepRecord(2, 20.0, step_ms, "decode", (0, 1), (1, 1),
                   (BlockTableRow(0, (0, 1), 9), BlockTableRow(1, (0, 2), 8)), 9, 1, 0, 1),
        StepRecord(3, 30.0, step_ms, "mixed", (1, 2), (1, 3),
                   (BlockTableRow(1, (0, 2), 9), BlockTableRow(2, (4,), 4)), 9, 0, 0, 0),
    )
    return ServingRun("tiny", "fp32", config, (r0, r1, r2), steps, 2, "2026-01-01T00:00:00")


def test_gantt_rows_bars_and_colours():
    fig = gantt_chart(_run())
    by_name = {t.name: t for t in fig.data}
    queue, prefill, decode = by_name["queue wait"], by_name["prefill"], by_name["decode"]
    assert prefill.marker.color == PREFILL_COLOR and decode.marker.color == DECODE_COLOR
    assert queue.marker.color == QUEUE_COLOR
    # request 2 waited from its arrival (15 ms) to its admission (30 ms)
    i = list(queue.y).index("request 2")
    assert queue.base[i] == 15.0 and queue.x[i] == 15.0
    # request 1: prefill 0 → 10 ms (first token), decode 10 → 40 ms
    j = list(decode.y).index("request 1")
    assert decode.base[j] == 10.0 and decode.x[j] == 30.0
    assert "4 from shared blocks" in prefill.hovertext[list(prefill.y).index("request 1")]
    arrival = by_name["arrival (the request's colour)"]
    assert list(arrival.marker.color) == [request_color(i) for i in range(3)]
    assert list(by_name["done"].x) == [30.0, 40.0, 40.0]
    assert fig.layout.xaxis.title.text == TIME_AXIS
    assert list(fig.layout.yaxis.categoryarray) == ["request 0", "request 1", "request 2"]
    assert fig.layout.yaxis.autorange == "reversed"


def test_gantt_of_a_partial_run_draws_waiting_and_prefilling_to_now():
    run = _run()
    waiting = RequestRecord(3, RequestSpec("w", (1, 2), 4, 5.0), None, (), (), (), "", 0, 0, "waiting")
    prefilling = RequestRecord(4, RequestSpec("p", (1, 2), 4, 0.0), 35.0, (), (), (), "", 0, 0,
                               "running")
    fig = gantt_chart(ServingRun(run.model, run.weights, run.config,
                                 (*run.requests, waiting, prefilling), run.steps, 2, run.created))
    by_name = {t.name: t for t in fig.data}
    queue = by_name["queue wait"]
    k = list(queue.y).index("request 3")
    assert queue.base[k] == 5.0 and queue.base[k] + queue.x[k] == 40.0  # to the last step's end
    p = by_name["prefill"]
    m = list(p.y).index("request 4")
    assert p.base[m] == 35.0 and p.x[m] == 5.0
    assert "request 3" not in by_name["done"].y


@pytest.mark.parametrize("sharing", [True, False])
def test_block_grid_colours_blocks_by_request_and_hatches_shared_ones(sharing):
    run = _run(sharing=sharing)
    fig = block_grid_chart(run, step=0)
    by_name = {t.name: t for t in fig.data}
    r0 = by_name["request 0"]
    assert r0.marker.color == request_color(0)
    cells = dict(zip(r0.base, r0.marker.pattern.shape))  # column → pattern (row 0: ids 0–11)
    assert set(cells) == {0, 1}
    assert cells[0] == (SHARED_PATTERN if sharing else "")
    assert "shared by requests 0, 1" in r0.hovertext[0] if sharing else "request 0" in r0.hovertext[0]
    assert ("shared (hatched)" in by_name) == sharing
    assert "4/4 tokens" in r0.hovertext[0] and "3/4 tokens" in r0.hovertext[1]
    free = by_name["free"]
    assert free.marker.color == "#e6e6e6"
    used = 3 if sharing else 4
    assert len(free.base) == 12 - used
    assert "after step 0" in fig.layout.title.text and f"{used} used" in fig.layout.title.text
    last = block_grid_chart(run)  # the default: the last step
    assert "after step 3" in last.layout.title.text
    assert request_color(2) == {t.name: t for t in last.data}["request 2"].marker.color


def test_throughput_and_batch_size_over_time():
    run = _run()
    assert tokens_per_step(run) == [2, 2, 2, 2]
    fig = throughput_chart(run)
    rate, window, batch = fig.data
    assert list(rate.x) == [10.0, 20.0, 30.0, 40.0]
    assert list(rate.y) == [200.0, 200.0, 200.0, 200.0]  # 2 tokens in 10 ms
    assert list(window.y) == pytest.approx([200.0] * 4)  # the stream so far: under a second
    run = _run(step_ms=600.0)  # steps of 600 ms, one after another: the last second holds two
    slow = replace(run, steps=tuple(replace(st, start_ms=600.0 * st.index) for st in run.steps))
    assert list(throughput_chart(slow).data[1].y) == pytest.approx([2 / 0.6, 4.0, 4.0, 4.0])
    assert list(batch.y) == [2, 2, 2, 2, 2] and batch.line.shape == "hv"
    # each step's size from its start to its end: the batch drops when the step without a
    # finished request starts, not one step later
    assert list(batch.x) == [st.start_ms for st in run.steps] + [40.0]
    assert fig.layout.xaxis.title.text == TIME_AXIS
    assert fig.layout.yaxis.title.text == "output tokens/s"
    assert fig.layout.yaxis2.title.text == "batch size (requests)"


def test_stream_summary_and_comparison_charts():
    on, off = _run(sharing=True), _run(sharing=False, step_ms=10.0)
    s = summarize_stream(on)
    assert s.throughput_tok_s == pytest.approx(1000 * 8 / 40)
    assert s.ttft_p50 == 10.0 and s.prompt_tokens == 14 and s.computed_prompt_tokens == 10
    assert s.peak_blocks == 3 and s.prefill_ms == 10.0
    assert summarize_stream(off).peak_blocks == 4
    fig = sharing_chart(off, on)
    bars = {(t.name, t.x[0]): t for t in fig.data}
    assert bars[("sharing on", "peak blocks")].y == (3,)
    assert bars[("sharing off", "peak blocks")].y == (4,)
    assert list(bars[("sharing on", "in the prompts")].y) == [14, 10]
    assert [a.title.text for a in (fig.layout.yaxis, fig.layout.yaxis2, fig.layout.yaxis3)] == [
        "blocks (peak in use)", "prompt tokens", "prefill steps' time (ms)"]
    cmp = batching_chart(_run("static"), _run("continuous"))
    names = {t.name for t in cmp.data}
    assert names == {"static", "continuous"}
    assert {t.marker.color for t in cmp.data} == {"#8c6d31", "#17becf"}
    assert cmp.layout.yaxis2.title.text == "time to first token (ms)"
    per = per_request_chart({"static": _run("static")}, {"static": "#8c6d31"})
    assert list(per.data[1].y) == [10.0, 10.0, 25.0]  # TTFT: request 2 arrived at 15 ms


def test_speculation_chips_and_chart():
    text = drafted_chips_html(["Ġa", "Ġb", "Ċ"], [False, True, True])
    assert text.count("ie-drafted") == 2 and "·a" in text and "↵" in text
    fig = speculation_chart([("rewrite", 20.0, 40.0, 0.8, 2.0), ("story", 20.0, 19.0, 0.1, 0.95)])
    assert [t.name for t in fig.data] == ["plain greedy", "speculative"]
    assert list(fig.data[1].y) == [40.0, 19.0]
    notes = [a.text for a in fig.layout.annotations]
    assert notes[0].startswith("2.00×") and "80% of drafts accepted" in notes[0]
    assert notes[1].startswith("0.95×")


def test_presentation_maps_every_serving_colour_to_a_projector_one():
    for color in (*REQUEST_COLORS, "#6b6ecf", QUEUE_COLOR):
        assert projector_color(color) != color or color in ("#393b79", "#843c39")  # dark already
    assert "#7b4173" in PROJECTOR and len(set(PROJECTOR.values())) == len(PROJECTOR)
    shown = presentation(block_grid_chart(_run(), step=0))
    assert {t.name: t for t in shown.data}["request 0"].marker.color == PROJECTOR[request_color(0)]
    gantt = presentation(gantt_chart(_run()))
    assert {t.name: t for t in gantt.data}["prefill"].marker.color == PROJECTOR[PREFILL_COLOR]


def test_the_live_batch_chart_draws_one_bar_per_recent_step():
    from charts.server_batch import live_batch_chart
    from charts.serving import BATCH_COLOR

    recent = [(100.0, 1, 50.0), (100.2, 8, 90.0), (100.5, 30, 160.0)]
    fig = live_batch_chart(recent, now=101.0)
    bar = fig.data[0]
    assert list(bar.y) == [1, 8, 30] and bar.marker.color == BATCH_COLOR
    assert [round(x, 1) for x in bar.x] == [-1.0, -0.8, -0.5]
    assert "30 runs in one forward of 160 ms" in bar.hovertemplate[2]
    assert fig.layout.xaxis.title.text == "seconds before now"
    assert fig.layout.yaxis.title.text == "runs in the step"
    assert fig.layout.yaxis.dtick == 5 and fig.layout.yaxis.tickformat == "d"  # whole runs
    assert live_batch_chart([(100.0, 2, 50.0)], now=101.0).layout.yaxis.dtick == 1  # never 0.5
