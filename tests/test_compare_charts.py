"""charts/compare.py on two example traces: the first difference is the one chip outlined, both
runs' points are each trace's own numbers, axes carry units, heatmaps share one colour scale."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from charts.attention import downsample, sequence_labels
from charts.compare import (
    RUN_COLORS,
    answer_chips_html,
    heatmap_pair,
    kv_chart,
    latency_chart,
    prompt_chips_html,
)
from charts.tokens import MARKED_STYLE as DIFF_STYLE
from engine.files import load_trace
from engine.lens.attention_stats import full_attention
from engine.lens.compare import token_diff
from engine.records.examples import examples


@pytest.fixture(scope="module")
def traces():
    return {e.name: load_trace(e.path) for e in examples()}


def chips(html: str) -> list[str]:
    return re.findall(r'<span class="ie-chip[^"]*"[^>]*>', html)


def test_only_the_first_differing_chip_is_outlined(traces):
    qa, multi = traces["qa"], traces["multilingual"]
    diff = token_diff(qa, multi)
    for trace in (qa, multi):
        spans = chips(answer_chips_html(trace, diff.answer))
        assert len(spans) == len(trace.steps)
        marked = [i for i, s in enumerate(spans) if "ie-first-diff" in s]
        assert marked == [diff.answer] and DIFF_STYLE in spans[diff.answer]
        spans = chips(prompt_chips_html(trace, diff.prompt))
        assert len(spans) == len(trace.prompt_token_ids)
        assert [i for i, s in enumerate(spans) if "ie-first-diff" in s] == [diff.prompt]
    assert "ie-first-diff" not in answer_chips_html(qa, None)
    assert "ie-first-diff" not in answer_chips_html(qa, len(qa.steps))  # the other run is longer


def test_latency_chart_plots_each_runs_own_steps_on_a_log_axis(traces):
    a, b = traces["qa"], traces["story"]
    fig = latency_chart(a, b)
    assert [t.name for t in fig.data] == ["run A", "run B"]
    for curve, trace in zip(fig.data, (a, b)):
        assert list(curve.y) == [s.latency_ms for s in trace.steps]
        assert list(curve.x) == list(range(len(trace.steps)))
    assert [t.line.color for t in fig.data] == [RUN_COLORS["A"], RUN_COLORS["B"]]
    assert fig.layout.yaxis.type == "log" and "(ms" in fig.layout.yaxis.title.text
    assert "step" in fig.layout.xaxis.title.text
    assert_ticks_state_their_values(fig, a, b)


def assert_ticks_state_their_values(fig, a, b):
    """Every tick of the log axis is written out in full (no plotly '2' for 200) and the axis
    spans every step of both runs."""
    axis = fig.layout.yaxis
    lo, hi = 10 ** axis.range[0], 10 ** axis.range[1]
    values = [s.latency_ms for t in (a, b) for s in t.steps]
    assert lo < min(values) and max(values) < hi
    assert len(axis.tickvals) >= 3 and all(lo <= v <= hi for v in axis.tickvals)
    for value, text in zip(axis.tickvals, axis.ticktext):
        assert float(text.replace(",", "")) == pytest.approx(value)


@pytest.mark.parametrize("base, spread", [(30.0, 2.0), (10.5, 3.0), (0.8, 0.1), (400.0, 3000.0)])
def test_latency_axis_over_any_range_has_labelled_round_ticks(traces, base, spread):
    a = traces["qa"]
    steps = tuple(replace(s, latency_ms=base + spread * (s.index % 3) / 2) for s in a.steps)
    flat = replace(a, steps=steps)
    fig = latency_chart(flat, flat)
    assert_ticks_state_their_values(fig, flat, flat)
    assert all(float(f"{v:.2g}") == v for v in fig.layout.yaxis.tickvals)  # round values


def test_kv_chart_in_mib(traces):
    a, b = traces["qa"], traces["story"]
    fig = kv_chart(a, b)
    for curve, trace in zip(fig.data, (a, b)):
        assert np.allclose(curve.y, [s.kv_bytes / 2**20 for s in trace.steps])
    assert fig.data[1].y[-1] == pytest.approx(b.kv_bytes / 2**20)
    assert fig.layout.yaxis.title.text == "KV cache (MiB)"


def test_heatmap_pair_shares_one_colour_scale(traces):
    """A causal map's first row is always weight 1; block means (a long run, as the page shows
    it) are not, so only one shared scale makes the same colour the same weight."""
    a, b = traces["qa"], traces["story"]
    ma, la, _ = downsample(full_attention(a, 15)[0], sequence_labels(a), 16)
    mb, lb, _ = downsample(full_attention(b, 15)[0], sequence_labels(b), 16)
    assert np.nanmax(ma) != pytest.approx(np.nanmax(mb))
    fa, fb = heatmap_pair(ma, la, mb, lb, "run A", "run B")
    top = max(np.nanmax(ma), np.nanmax(mb))
    assert fa.data[0].zmax == fb.data[0].zmax == pytest.approx(top)
    assert fa.data[0].zmin == fb.data[0].zmin == 0
    assert fa.layout.height == fb.layout.height
    assert list(fa.data[0].x) == la and list(fb.data[0].x) == lb
    assert fa.layout.title.text == "run A" and "key" in fa.layout.xaxis.title.text
