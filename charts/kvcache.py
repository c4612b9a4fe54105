"""Figures for the KV-cache page."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from engine.trace import Trace

from .attention import HEAD_COLORS
from .live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR

ATTENTION_COLORS = {"MHA": "#d62728", "GQA": "#1f77b4", "MLA": "#2ca02c"}


def live_memory_chart(trace: Trace) -> go.Figure:
    """Measured KV bytes per step (from the tensors) and the formula, which must coincide."""
    steps = trace.steps
    formula = [trace.model.kv_bytes(s.context_len) if trace.settings.kv_cache else 0 for s in steps]
    fig = go.Figure([
        go.Scatter(x=[s.index for s in steps], y=[s.kv_bytes / 1024 for s in steps],
                   mode="markers", name="measured (tensor nbytes)", marker={"color": KV_COLOR, "size": 9}),
        go.Scatter(x=[s.index for s in steps], y=[f / 1024 for f in formula], mode="lines",
                   name="formula", line={"color": "black", "dash": "dot"})])
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.1})
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="KV cache (KiB)", rangemode="tozero")
    return fig


def on_off_chart(on_ms: np.ndarray, off_ms: np.ndarray) -> go.Figure:
    fig = go.Figure([
        go.Scatter(y=on_ms, mode="lines", name="cache on", line={"color": DECODE_COLOR}),
        go.Scatter(y=off_ms, mode="lines", name="cache off (recompute everything)",
                   line={"color": PREFILL_COLOR})])
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.1})
    fig.update_xaxes(title_text="step (0 = prefill)")
    fig.update_yaxes(title_text="step time (ms)", rangemode="tozero")
    return fig


def per_token_bars(names: list[str], kinds: list[str], values: list[float]) -> go.Figure:
    fig = go.Figure(go.Bar(x=names, y=[v / 1024 for v in values], customdata=kinds,
                           marker_color=[ATTENTION_COLORS[k] for k in kinds],
                           hovertemplate="%{x} (%{customdata})<br>%{y:,.1f} KiB per token"
                                         "<extra></extra>"))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_yaxes(title_text="KV cache per token (KiB)")
    return fig


def variant_chart(runs, field: str, title: str, scale: float = 1.0) -> go.Figure:
    fig = go.Figure()
    for i, run in enumerate(runs):
        fig.add_trace(go.Scatter(y=getattr(run, field) / scale, mode="lines", name=run.config.label,
                                 line={"color": HEAD_COLORS[i % len(HEAD_COLORS)]}))
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.12})
    fig.update_xaxes(title_text="generated token")
    fig.update_yaxes(title_text=title, rangemode="tozero")
    return fig


def blocks_chart(layout, names: list[str]) -> go.Figure:
    """Physical blocks in allocation order, coloured by owner, filled share as hover."""
    owner, fill, labels = {}, {}, {}
    for seq, table in enumerate(layout.block_tables):
        for logical, physical in enumerate(table):
            used = min(layout.block_size, layout.lengths[seq] - logical * layout.block_size)
            owner[physical], fill[physical] = seq, used
            labels[physical] = f"{names[seq]} · logical block {logical} · {used}/{layout.block_size} used"
    xs = sorted(owner)
    fig = go.Figure(go.Bar(x=xs, y=[fill[p] for p in xs], hovertext=[labels[p] for p in xs],
                           hoverinfo="text", marker_color=[HEAD_COLORS[owner[p] % 14] for p in xs]))
    fig.add_hline(y=layout.block_size, line_dash="dot", annotation_text="block size")
    fig.update_layout(height=260, margin={"l": 10, "r": 10, "t": 20, "b": 10}, bargap=0.05)
    fig.update_xaxes(title_text="physical block id (allocation order)")
    fig.update_yaxes(title_text="token slots used", range=[0, layout.block_size * 1.15])
    return fig
