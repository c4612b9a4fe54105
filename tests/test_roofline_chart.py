"""The roofline figure: ticks labelled with their own values, axes fitted to the points and the
ridge, the ridge label at the ridge, points named in the legend (no overlapping text), and the
step time it uses (model forward when recorded) said on the chart."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from charts.timing import MARGIN, log_ticks, roofline_chart, tick_label
from engine import GenerationSettings, generate_trace
from engine.kernels.microbench import Ceilings
from engine.timing.roofline import (
    FORWARD_ONLY,
    WHOLE_STEP,
    Work,
    step_work,
    timed_by,
    trace_points,
    utilization,
)

CEIL = Ceilings(device="x", bandwidth_gb_s=20.0, matmul_tflop_s=0.1, dtype="float32",
                measured_at="now")  # ridge 5 FLOP/B, peak 100 GFLOP/s
POINTS = {
    "prefill": (Work(flops=8e9, bytes=5e8), 200.0),  # 16 FLOP/B, 40 GFLOP/s
    "decode (median step)": (Work(flops=2e8, bytes=5e8), 1000.0),  # 0.4 FLOP/B, 0.2 GFLOP/s
    "decode, eager (static cache)": (Work(flops=2e8, bytes=5e8), 500.0),
    "decode, native C": (Work(flops=2e8, bytes=5e8), 100.0),
}


def test_every_tick_label_states_its_value():
    fig = roofline_chart(CEIL, POINTS)
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        assert axis.type == "log" and axis.tickmode == "array"
        assert len(axis.tickvals) >= 3
        for value, text in zip(axis.tickvals, axis.ticktext):
            assert float(text.replace(",", "")) == pytest.approx(value)
    y = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext))
    assert y[0.2] == "0.2" and y[100] == "100"  # 0.2 GFLOP/s no longer reads "2"
    assert "GFLOP/s" in fig.layout.yaxis.title.text
    assert "FLOP per byte" in fig.layout.xaxis.title.text


def test_tick_helpers():
    assert log_ticks(0.15, 30) == [0.2, 0.5, 1, 2, 5, 10, 20]
    assert log_ticks(0.01, 1e5) == [0.01, 0.1, 1, 10, 100, 1000, 10000, 1e5]  # wide: decades
    assert [tick_label(v) for v in (0.05, 0.2, 1, 1000, 1e5)] == ["0.05", "0.2", "1", "1,000",
                                                                 "100,000"]


def test_axes_fit_the_points_and_the_ridge():
    fig = roofline_chart(CEIL, POINTS)
    lo, hi = fig.layout.xaxis.range  # log10 units
    assert lo == pytest.approx(math.log10(0.4 / MARGIN))  # the lowest intensity
    assert hi == pytest.approx(math.log10(16 * MARGIN))  # the prefill, right of the ridge (5)
    y_lo, y_hi = fig.layout.yaxis.range
    assert y_lo == pytest.approx(math.log10(0.2 / MARGIN))
    assert y_hi == pytest.approx(math.log10(100 * MARGIN))  # the peak
    roof = fig.data[0]
    assert roof.x[0] == pytest.approx(10 ** lo) and roof.x[-1] == pytest.approx(10 ** hi)
    assert list(roof.y[1:]) == [100.0, 100.0]  # flat right of the ridge


def test_ridge_label_sits_at_the_ridge_point():
    fig = roofline_chart(CEIL, POINTS)
    (note,) = [a for a in fig.layout.annotations if "ridge" in a.text]
    assert note.x == pytest.approx(math.log10(5.0)) and note.y == pytest.approx(math.log10(100))
    assert note.xref == "x" and note.yref == "y" and "5 FLOP/B" in note.text
    line = next(t for t in fig.data if t.name == "ridge")
    assert set(line.x) == {5.0}


def test_points_are_named_in_the_legend_not_by_overlapping_text():
    fig = roofline_chart(CEIL, POINTS)
    named = {t.name: t for t in fig.data if t.name in POINTS}
    assert set(named) == set(POINTS)
    for name, trace in named.items():
        assert trace.mode == "markers" and trace.showlegend is not False
        work, ms = POINTS[name]
        assert trace.y[0] == pytest.approx(utilization(work, ms).flop_s / 1e9)
    colours = {named[n].marker.color for n in ("prefill", "decode, eager (static cache)",
                                                "decode, native C")}
    assert len(colours) == 3  # each variant its own colour
    assert fig.layout.legend.orientation == "h"


def test_the_chart_says_which_time_it_uses():
    assert FORWARD_ONLY in roofline_chart(CEIL, POINTS, FORWARD_ONLY).layout.title.text
    assert WHOLE_STEP in roofline_chart(CEIL, POINTS, WHOLE_STEP).layout.title.text


def test_points_use_the_forward_time_when_recorded(tiny_lm):
    trace = generate_trace(tiny_lm, "Hello there", GenerationSettings(max_new_tokens=4))
    assert timed_by(trace) == FORWARD_ONLY  # the runner records the forward alone
    assert all(s.forward_ms < s.latency_ms for s in trace.steps)
    forward = [s.latency_ms / 4 for s in trace.steps]  # distinct from every latency
    timed = replace(trace, steps=tuple(replace(s, forward_ms=f)
                                       for s, f in zip(trace.steps, forward)))
    points = trace_points(timed)
    assert points["prefill"] == (step_work(trace, trace.steps[0]), forward[0])
    assert points["decode (median step)"][1] == pytest.approx(sorted(forward[1:])[1])
    # an older file: no forward times (or only some) → the whole step, and the chart says so
    old = replace(trace, steps=tuple(replace(s, forward_ms=None) for s in trace.steps))
    some = replace(trace, steps=(trace.steps[0],) + old.steps[1:])
    for untimed in (old, some):
        assert timed_by(untimed) == WHOLE_STEP
        assert trace_points(untimed)["prefill"][1] == trace.steps[0].latency_ms
        assert trace_points(untimed)["decode (median step)"][1] == pytest.approx(
            sorted(s.latency_ms for s in trace.steps[1:])[1])
