"""Figures for shrinking the KV cache (engine/kv/shrink): quality against cache bytes, a point
per method and budget, and which keys a head still attends to at each decode step."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.kv.shrink.budget import METHODS, PROMPT_METHODS, SPARSE_METHODS
from engine.kv.shrink.needle import LengthPoint
from engine.kv.shrink.run import ShrinkRun
from i18n import N_, _

from .attention import MASKED_COLOR
from .live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR

# one colour per method in every figure of the section, none of them the app's colours for the
# KV cache, prefill and decode (charts/live.py), which the long-context chart beside them uses;
# the unmodified model is black
METHOD_COLORS = {"latent": "#9467bd", "topk": "#ff7f0e", "indexer": "#e377c2", "h2o": "#8c564b",
                 "snapkv": "#bcbd22", "window": "#17becf", "knorm": "#7f7f7f"}
# where each method's budget labels sit. At one budget H2O and window hold the same bytes (one
# x), as SnapKV and key norm do; top-k reads nearly what the unmodified model reads, beside them
LABEL_PLACES = {"latent": "top center", "topk": "bottom center", "indexer": "bottom center",
                "h2o": "middle right", "snapkv": "top center", "window": "top center",
                "knorm": "middle left"}
UNMODIFIED_COLOR = "#222222"
METRICS = {"kl": N_("mean KL(unmodified ‖ method), nats"), "top1": N_("top-1 agreement"),
           "ppl": N_("perplexity of the run's tokens")}
AXES = {"read": N_("KV cache read per decode step (MiB)"),
        "held": N_("KV cache held at the end (MiB)")}
MIB = 2**20


def _value(run: ShrinkRun, metric: str) -> float:
    return {"kl": run.mean_kl, "top1": run.top1_agreement, "ppl": run.ppl}[metric]


def _bytes(run: ShrinkRun, axis: str, dense: bool = False) -> float:
    if axis == "held":
        return float((run.dense_kv_bytes if dense else run.kv_bytes)[-1])
    series = run.dense_read_bytes if dense else run.read_bytes
    return float(np.median(series)) if len(series) else 0.0


def budget_label(run: ShrinkRun, short: bool = True) -> str:
    """What a run's budget came to, in its method's unit: a rank, keys per head, tokens held
    (`short`: a chart point's label)."""
    if run.method == "latent":
        text = N_("r={n}") if short else N_("rank {n}")
    elif run.method in SPARSE_METHODS:
        text = N_("k={n}") if short else N_("{n} keys per head")
    elif run.method in PROMPT_METHODS:
        text = N_("{n} tok + new") if short else N_("{n} prompt tokens kept, and the new ones")
    else:
        text = N_("{n} tok") if short else N_("{n} tokens held")
    return _(text).format(n=run.count)


def shrink_chart(runs: list[ShrinkRun], metric: str = "kl", axis: str = "read") -> go.Figure:
    """A point per (method, budget), a line through a method's points in bytes order; the
    unmodified model as a black diamond, under the methods' points (a method that holds the
    whole cache sits on it). Perplexity on a log axis: a method that breaks the model reaches
    hundreds while the others stay near the unmodified."""
    fig = go.Figure()
    if runs:
        base = runs[0]
        fig.add_trace(go.Scatter(
            x=[_bytes(base, axis, dense=True) / MIB],
            y=[{"kl": 0.0, "top1": 1.0, "ppl": base.dense_ppl}[metric]], mode="markers",
            name=_("unmodified model"), marker={"size": 16, "symbol": "diamond-open",
                                                "color": UNMODIFIED_COLOR,
                                                "line": {"width": 2.5}}, cliponaxis=False,
            hovertext=[_("unmodified model: {held:,} B held, {read:,.0f} B read per step, "
                         "perplexity {ppl:.3f}").format(held=int(base.dense_kv_bytes[-1]),
                                                        read=_bytes(base, "read", True),
                                                        ppl=base.dense_ppl)],
            hoverinfo="text"))
    places = label_places(runs, metric, axis)
    for method in (m for m in METHODS if any(r.method == m for r in runs)):
        found = sorted((r for r in runs if r.method == method), key=lambda r: _bytes(r, axis))
        fig.add_trace(go.Scatter(
            x=[_bytes(r, axis) / MIB for r in found], y=[_value(r, metric) for r in found],
            mode="lines+markers+text", name=_(METHODS[method]),
            text=[budget_label(r) for r in found],
            textposition=[places[id(r)] for r in found],
            textfont={"color": METHOD_COLORS[method]},
            marker={"size": 11, "color": METHOD_COLORS[method]},
            cliponaxis=False,  # a point at 0 (no change) is drawn whole on the axis
            line={"color": METHOD_COLORS[method], "width": 1.5},
            hovertext=[_hover(r) for r in found], hoverinfo="text"))
    # the legend under the plot: up to 8 entries in a row would reach the chart's toolbar above
    fig.update_layout(height=460, margin={"l": 10, "r": 30, "t": 40, "b": 10},
                      legend={"orientation": "h", "y": -0.2, "yanchor": "top", "x": 0})
    fig.update_xaxes(title_text=_(AXES[axis]), rangemode="tozero", tickformat=",")
    ys = [_value(r, metric) for r in runs] + [{"kl": 0.0, "top1": 1.0, "ppl": runs[0].dense_ppl}[
        metric] if runs else 0.0]
    if metric == "ppl":
        ticks = log_ticks(min(ys), max(ys))
        fig.update_yaxes(title_text=_(METRICS[metric]) + " " + _("(log scale)"), type="log",
                         tickvals=ticks, ticktext=[f"{t:,g}" for t in ticks],
                         range=[math.log10(min(ys)) - 0.1, math.log10(max(ys)) + 0.1])
    else:  # room under a point at 0 and over one at 1 for its label
        low, high = min(0.0, *ys), max(ys) if ys else 1.0
        pad = 0.1 * ((high - low) or 1.0)
        fig.update_yaxes(title_text=_(METRICS[metric]), range=[low - pad, high + pad],
                         tickformat=".0%" if metric == "top1" else None)
    return fig


def log_ticks(low: float, high: float) -> list[float]:
    """1, 2, 5 × powers of ten from `low` to `high` (plotly's own log ticks label 2…9 under each
    power of ten, which reads like a scale falling from 100 to 2)."""
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1,
                                          math.ceil(math.log10(high)) + 1)
             for m in (1, 2, 5) if low / 1.3 <= m * 10.0 ** e <= high * 1.3]
    return ticks or [low, high]


def label_places(runs: list[ShrinkRun], metric: str, axis: str) -> dict[int, str]:
    """Each point's label place: its method's, unless a point placed before it is near (within
    5 % of the x span and 8 % of the y span) and took that place — then the first free one."""
    xs = [_bytes(r, axis) for r in runs]
    ys = [_value(r, metric) for r in runs]
    if metric == "ppl":
        ys = [math.log10(max(y, 1e-9)) for y in ys]
    dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    order = ("top center", "bottom center", "middle right", "middle left")
    taken: list[tuple[float, float, str]] = []
    places = {}
    for r, x, y in zip(runs, xs, ys):
        near = {p for tx, ty, p in taken if abs(tx - x) < 0.05 * dx and abs(ty - y) < 0.08 * dy}
        place = next((p for p in (LABEL_PLACES[r.method], *order) if p not in near),
                     LABEL_PLACES[r.method])
        taken.append((x, y, place))
        places[id(r)] = place
    return places


def _hover(r: ShrinkRun) -> str:
    return _("{method} at {budget}: {held:,} B held ({share:.0%} of the unmodified), "
             "{read:,.0f} B read per step, KL {kl:.4f} nats, top-1 {top1:.1%}, perplexity "
             "{ppl:.3f} (unmodified {dense:.3f}), decode {ms:.1f} ms").format(
        method=_(METHODS[r.method]), budget=_("full") if r.budget == "full" else r.budget,
        held=int(r.kv_bytes[-1]),
        share=r.kv_bytes[-1] / max(1, r.dense_kv_bytes[-1]), read=_bytes(r, "read"),
        kl=r.mean_kl, top1=r.top1_agreement, ppl=r.ppl, dense=r.dense_ppl, ms=r.decode_ms)


def kept_heatmap(run: ShrinkRun, head: int) -> go.Figure:
    """One head's attention at each decode step over every position so far: blank where the
    key was not attended (sparse) or no longer held (evicted)."""
    rows = run.rows[:, head, :]  # (steps, positions)
    shown = np.where(rows > 0, rows, np.nan)
    steps, positions = rows.shape
    fig = go.Figure(go.Heatmap(
        z=shown, x=list(range(positions)), y=list(range(1, steps + 1)),
        colorscale=[[0.0, "#deebf7"], [1.0, "#08306b"]],  # the lightest weight is not the grey
        zmin=0, zmax=float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0,
        colorbar={"title": {"text": _("weight")}},
        hovertemplate=_("decode step %{y}, key at position %{x}: weight %{z:.3f}")
        + "<extra></extra>"))
    fig.add_vline(x=run.prompt_tokens - 0.5, line_dash="dot", line_color="#555555",
                  annotation_text=_("generated →"), annotation_position="top right")
    fig.update_layout(height=360, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      plot_bgcolor=MASKED_COLOR)
    fig.update_xaxes(title_text=_("key position (grey: not attended or evicted)"))
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
        fig.update_yaxes(title_text=title, rangemode="tozero", tickformat=",", row=row, col=1)
    fig.update_xaxes(title_text=_("prompt tokens"), tickformat=",", row=3, col=1)
    fig.update_layout(height=560, margin={"l": 10, "r": 10, "t": 20, "b": 10}, showlegend=False)
    return fig
