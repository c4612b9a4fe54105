"""Figures for comparing two runs: token chips with the first difference marked, both runs' step
latency and KV cache on shared axes, and one layer/head's attention of both on one colour scale.
Pure functions of Traces and arrays (engine/lens/compare.py computes what they mark)."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from engine.records.trace import Trace
from i18n import _

from .attention import heatmap
from .tokens import chip, piece_text, special_note

RUN_COLORS = {"A": "#1f77b4", "B": "#e6550d"}  # blue and orange: apart for colour-blind eyes too
RUN_SYMBOLS = {"A": "circle", "B": "diamond"}
def prompt_chips_html(trace: Trace, first_diff: int | None) -> str:
    """The prompt's tokens as chips (special tokens marked), chip `first_diff` outlined in red."""
    parts = [chip(piece if special else piece_text(piece),
                   _("prompt token {i} · id {id}").format(i=i, id=tid) + special_note(special),
                   "special" if special else "prompt", marked=i == first_diff)
             for i, (tid, piece, special) in enumerate(zip(trace.prompt_token_ids,
                                                           trace.prompt_pieces,
                                                           trace.prompt_special))]
    return '<div class="ie-chips">' + "".join(parts) + "</div>"


def answer_chips_html(trace: Trace, first_diff: int | None) -> str:
    """The generated tokens as chips, chip `first_diff` outlined in red (when this run has a
    token there: the other run may simply be longer)."""
    parts = [chip(piece_text(s.piece),
                   _("answer token {index} · id {id} · {ms} ms · p={p} (rank {rank})").format(
                       index=s.index, id=s.token_id, ms=f"{s.latency_ms:.1f}",
                       p=f"{s.chosen_prob:.3f}", rank=s.chosen_rank + 1),
                   "gen", marked=s.index == first_diff)
             for s in trace.steps]
    return '<div class="ie-chips">' + ("".join(parts) or _("(no answer tokens)")) + "</div>"


def latency_chart(a: Trace, b: Trace) -> go.Figure:
    """Every step's latency of both runs on one log axis (a prefill can be 10× a decode step):
    step 0 is the prefill, then one point per decode step."""
    fig = go.Figure()
    for name, trace in (("A", a), ("B", b)):
        fig.add_trace(go.Scatter(
            x=[s.index for s in trace.steps], y=[s.latency_ms for s in trace.steps],
            name=_("run {name}").format(name=name), mode="lines+markers",
            line={"color": RUN_COLORS[name], "width": 2},
            marker={"symbol": RUN_SYMBOLS[name], "size": 6},
            hovertemplate=_("run {name}<br>step %{{x}}<br>%{{y:.1f}} ms<extra></extra>").format(
                name=name)))
    fig.update_layout(height=340, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      title=_("Latency of every step"), legend={"orientation": "h", "y": -0.25})
    fig.update_xaxes(title_text=_("step (0 = prefill of the whole prompt)"), rangemode="tozero")
    latencies = [s.latency_ms for t in (a, b) for s in t.steps if s.latency_ms > 0]
    axis = {"type": "log"}
    if latencies:
        lo, hi = min(latencies), max(latencies)
        pad = 1.3 if len(log_axis_ticks(lo / 1.3, hi * 1.3)) >= 3 else 2.0  # 2: ≥ 3 ticks always
        axis = _log_axis(lo / pad, hi * pad)
    fig.update_yaxes(title_text=_("step latency (ms, log scale)"), **axis)
    return fig


# Tick mantissas per decade, coarsest first: the first set that puts 3 ticks on the axis is used.
LOG_MANTISSAS = ((1, 2, 5), (1, 2, 3, 5), (1, 1.5, 2, 3, 5, 7), tuple(range(1, 10)),
                 tuple(m / 2 for m in range(2, 20)))


def log_axis_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values on a log axis over [lo, hi]: 1-2-5 per decade where that gives 3 ticks,
    finer round values over a narrow range (decode steps of 30–40 ms)."""
    if not 0 < lo < hi:
        raise ValueError(f"a log axis needs 0 < lo < hi, got {lo}, {hi}")
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks: list[float] = []
    for mantissas in LOG_MANTISSAS:
        ticks = sorted({v for d in decades for m in mantissas
                        if lo <= (v := float(f"{m}e{d}")) <= hi})
        if len(ticks) >= 3:
            break
    return ticks


def _log_axis(lo: float, hi: float) -> dict:
    """A log axis whose every tick states its own value in full (plotly's own writes 200 as 2)."""
    ticks = log_axis_ticks(lo, hi)
    return {"type": "log", "range": [math.log10(lo), math.log10(hi)], "tickmode": "array",
            "tickvals": ticks, "ticktext": [f"{v:,g}" for v in ticks]}


def kv_chart(a: Trace, b: Trace) -> go.Figure:
    """Both runs' measured KV-cache size after every step (0 for a run without a cache)."""
    fig = go.Figure()
    for name, trace in (("A", a), ("B", b)):
        fig.add_trace(go.Scatter(
            x=[s.index for s in trace.steps], y=[s.kv_bytes / 2**20 for s in trace.steps],
            name=_("run {name}").format(name=name), mode="lines",
            line={"color": RUN_COLORS[name], "width": 2, "dash": "solid" if name == "A" else "dash"},
            hovertemplate=_("run {name}<br>step %{{x}}<br>%{{y:.2f}} MiB<extra></extra>").format(
                name=name)))
    fig.update_layout(height=340, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      title=_("KV cache after every step"), legend={"orientation": "h", "y": -0.25})
    fig.update_xaxes(title_text=_("step (0 = prefill of the whole prompt)"), rangemode="tozero")
    fig.update_yaxes(title_text=_("KV cache (MiB)"), rangemode="tozero")
    return fig


def heatmap_pair(matrix_a: np.ndarray, labels_a: list[str], matrix_b: np.ndarray,
                 labels_b: list[str], title_a: str, title_b: str) -> tuple[go.Figure, go.Figure]:
    """Two query × key heatmaps on one colour scale (0 to the larger maximum of the two), so the
    same colour is the same weight in both."""
    finite = [float(np.nanmax(m)) for m in (matrix_a, matrix_b) if np.isfinite(m).any()]
    top = max(finite) if finite else 1.0
    figs = (heatmap(matrix_a, labels_a, title_a), heatmap(matrix_b, labels_b, title_b))
    height = max(f.layout.height for f in figs)
    for fig in figs:
        fig.update_traces(zmin=0, zmax=top)
        fig.update_layout(height=height)
    return figs
