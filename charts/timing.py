"""Timing figures: the run's timeline, the roofline, and the sweep results."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from engine.microbench import Ceilings
from engine.roofline import Work, utilization

from .live import DECODE_COLOR, PREFILL_COLOR

COMPILED_COLOR = "#9467bd"
NATIVE_COLOR = "#2ca02c"


def timeline_chart(trace) -> go.Figure:
    """Tokenization, then prefill as one wide bar, then each decode step, on a time axis (ms)."""
    times = trace.token_times_ms
    starts = [trace.tokenize_ms] + list(times[:-1])
    fig = go.Figure()
    fig.add_trace(go.Bar(y=["tokenize"], x=[trace.tokenize_ms], base=[0], orientation="h",
                         marker_color="#999", name="tokenize",
                         hovertemplate="tokenize %{x:.1f} ms<extra></extra>"))
    for phase, color in (("prefill", PREFILL_COLOR), ("decode", DECODE_COLOR)):
        idx = [i for i, s in enumerate(trace.steps) if s.phase == phase]
        fig.add_trace(go.Bar(
            y=[phase] * len(idx), x=[trace.steps[i].latency_ms for i in idx],
            base=[starts[i] for i in idx], orientation="h", marker_color=color, name=phase,
            marker_line={"color": "white", "width": 1}, customdata=idx,
            hovertemplate="step %{customdata}: %{x:.1f} ms (from %{base:.0f} ms)<extra></extra>"))
    fig.update_layout(barmode="overlay", height=220, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      showlegend=False)
    fig.update_xaxes(title_text="time since the request (ms)")
    fig.update_yaxes(categoryorder="array", categoryarray=["decode", "prefill", "tokenize"])
    return fig


def roofline_chart(ceil: Ceilings, points: dict[str, tuple[Work, float]]) -> go.Figure:
    """Log-log roofline: attainable FLOP/s = min(peak, bandwidth × intensity); measured points."""
    peak, bw = ceil.matmul_tflop_s * 1e12, ceil.bandwidth_gb_s * 1e9
    xs = np.logspace(-1, 4, 200)
    fig = go.Figure(go.Scatter(x=xs, y=np.minimum(peak, bw * xs) / 1e9, mode="lines",
                               name="roofline (measured)", line={"color": "black"},
                               hovertemplate="intensity %{x:.2f} FLOP/B<br>ceiling %{y:.1f} "
                                             "GFLOP/s<extra></extra>"))
    for name, (work, ms) in points.items():
        color = (PREFILL_COLOR if "prefill" in name else COMPILED_COLOR if "compiled" in name
                 else NATIVE_COLOR if "native" in name else DECODE_COLOR)
        fig.add_trace(go.Scatter(
            x=[work.intensity], y=[utilization(work, ms).flop_s / 1e9], mode="markers+text",
            text=[name], name=name,  # decode points share one intensity: labels to the side
            textposition="top center" if "prefill" in name else "middle right",
            marker={"size": 12, "color": color},
            hovertemplate=f"{name}<br>intensity %{{x:.2f}} FLOP/B<br>achieved %{{y:.2f}} GFLOP/s"
                          f"<br>{ms:.1f} ms<extra></extra>"))
    fig.add_vline(x=ceil.ridge, line_dash="dot",
                  annotation_text=f"ridge {ceil.ridge:.0f} FLOP/B", annotation_position="bottom right")
    fig.update_layout(height=420, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte moved)")
    fig.update_yaxes(type="log", title_text="GFLOP/s")
    return fig


def sweep_chart(points, x_title: str, y_title: str, rate: bool = False) -> go.Figure:
    """One measured point per size; `rate` plots tokens/s instead of milliseconds."""
    fig = go.Figure(go.Scatter(
        x=[p.size for p in points], y=[p.tokens_per_s if rate else p.ms for p in points],
        mode="lines+markers", hovertemplate="%{x}: %{y:.1f}<extra></extra>"))
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    return fig
