"""Figures for shrinking the KV cache (engine/kv/shrink): quality against cache bytes, a point
per method and budget, and which keys a head still attends to at each decode step."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.kv.shrink.budget import METHODS
from engine.kv.shrink.needle import LengthPoint
from engine.kv.shrink.run import ShrinkRun
from i18n import N_, _

from .live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR

# one colour per method in every figure of the section; the unmodified model is black
METHOD_COLORS = {"latent": "#2ca02c", "topk": "#1f77b4", "indexer": "#17becf", "h2o": "#d62728",
                 "snapkv": "#ff7f0e", "window": "#9467bd", "knorm": "#8c564b"}
UNMODIFIED_COLOR = "#222222"
METRICS = {"kl": N_("mean KL(unmodified ‖ method), nats"), "top1": N_("top-1 agreement"),
           "ppl": N_("perplexity of the run's tokens")}
AXES = {"read": N_("KV bytes read per decode step (KiB)"),
        "held": N_("KV bytes held at the end (KiB)")}


def _value(run: ShrinkRun, metric: str) -> float:
    return {"kl": run.mean_kl, "top1": run.top1_agreement, "ppl": run.ppl}[metric]


def _bytes(run: ShrinkRun, axis: str, dense: bool = False) -> float:
    if axis == "held":
        return float((run.dense_kv_bytes if dense else run.kv_bytes)[-1])
    series = run.dense_read_bytes if dense else run.read_bytes
    return float(np.median(series)) if len(series) else 0.0


def shrink_chart(runs: list[ShrinkRun], metric: str = "kl", axis: str = "read") -> go.Figure:
    """A point per (method, budget), a line through a method's points in bytes order; the
    unmodified model as a black diamond."""
    fig = go.Figure()
    for method in METHODS:
        found = sorted((r for r in runs if r.method == method), key=lambda r: _bytes(r, axis))
        if not found:
            continue
        fig.add_trace(go.Scatter(
            x=[_bytes(r, axis) / 1024 for r in found], y=[_value(r, metric) for r in found],
            mode="lines+markers+text", name=_(METHODS[method]), text=[r.budget for r in found],
            textposition="top center", marker={"size": 11, "color": METHOD_COLORS[method]},
            cliponaxis=False,  # a point at 0 (no change) is drawn whole on the axis
            line={"color": METHOD_COLORS[method], "width": 1.5},
            hovertext=[_hover(r) for r in found], hoverinfo="text"))
    if runs:
        base = runs[0]
        fig.add_trace(go.Scatter(
            x=[_bytes(base, axis, dense=True) / 1024],
            y=[{"kl": 0.0, "top1": 1.0, "ppl": base.dense_ppl}[metric]], mode="markers",
            name=_("unmodified model"), marker={"size": 14, "symbol": "diamond",
                                                "color": UNMODIFIED_COLOR}, cliponaxis=False,
            hovertext=[_("unmodified model: {held:,} B held, {read:,.0f} B read per step, "
                         "perplexity {ppl:.3f}").format(held=int(base.dense_kv_bytes[-1]),
                                                        read=_bytes(base, "read", True),
                                                        ppl=base.dense_ppl)],
            hoverinfo="text"))
    # the legend under the plot: up to 8 entries in a row would reach the chart's toolbar above
    fig.update_layout(height=460, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": -0.2, "yanchor": "top", "x": 0})
    fig.update_xaxes(title_text=_(AXES[axis]), rangemode="tozero")
    fig.update_yaxes(title_text=_(METRICS[metric]), rangemode="tozero")
    return fig


def _hover(r: ShrinkRun) -> str:
    return _("{method} at {budget}: {held:,} B held ({share:.0%} of the unmodified), "
             "{read:,.0f} B read per step, KL {kl:.4f} nats, top-1 {top1:.1%}, perplexity "
             "{ppl:.3f} (unmodified {dense:.3f}), decode {ms:.1f} ms").format(
        method=_(METHODS[r.method]), budget=r.budget, held=int(r.kv_bytes[-1]),
        share=r.kv_bytes[-1] / max(1, r.dense_kv_bytes[-1]), read=_bytes(r, "read"),
        kl=r.mean_kl, top1=r.top1_agreement, ppl=r.ppl, dense=r.dense_ppl, ms=r.decode_ms)


def kept_heatmap(run: ShrinkRun, head: int) -> go.Figure:
    """One head's attention at each decode step over every position so far: blank where the
    key was not attended (sparse) or no longer held (evicted)."""
    rows = run.rows[:, head, :]  # (steps, positions)
    shown = np.where(rows > 0, rows, np.nan)
    steps, positions = rows.shape
    fig = go.Figure(go.Heatmap(
        z=shown, x=list(range(positions)), y=list(range(1, steps + 1)), colorscale="Blues",
        zmin=0, zmax=float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0,
        colorbar={"title": {"text": _("weight")}},
        hovertemplate=_("decode step %{y}, key at position %{x}: weight %{z:.3f}")
        + "<extra></extra>"))
    fig.add_vline(x=run.prompt_tokens - 0.5, line_dash="dot", line_color="#888888",
                  annotation_text=_("prompt | generated"), annotation_position="top left")
    fig.update_layout(height=360, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      plot_bgcolor="#f4f4f4")
    fig.update_xaxes(title_text=_("key position (blank: not attended or evicted)"))
    fig.update_yaxes(title_text=_("decode step"), autorange="reversed")
    return fig


def long_context_chart(points: list[LengthPoint]) -> go.Figure:
    """KV bytes, TTFT and ITL of the unmodified model against the prompt's length: three panels
    over one x axis (each its own unit)."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    xs = [p.tokens for p in points]
    panels = ((1, [p.kv_bytes / 2**20 for p in points], _("KV cache (MiB)"), KV_COLOR),
              (2, [p.ttft_ms for p in points], _("TTFT (ms)"), PREFILL_COLOR),
              (3, [p.itl_ms for p in points], _("ITL (ms)"), DECODE_COLOR))
    for row, ys, title, color in panels:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=title,
                                 line={"color": color},
                                 marker={"size": 9, "symbol": ["circle-open" if p.delayed
                                                               else "circle" for p in points]},
                                 hovertemplate=_("%{x:,} prompt tokens: %{y:,.1f}")
                                 + f" {title}<extra></extra>"), row=row, col=1)
        fig.update_yaxes(title_text=title, rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text=_("prompt tokens"), row=3, col=1)
    fig.update_layout(height=560, margin={"l": 10, "r": 10, "t": 20, "b": 10}, showlegend=False)
    return fig
