"""Timing figures: the run's timeline, the roofline, the sweep results and the dtype comparison."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from engine.kernels.microbench import Ceilings
from engine.timing.roofline import Work, utilization
from i18n import N_, _

from .live import DECODE_COLOR, PREFILL_COLOR

COMPILED_COLOR = "#9467bd"
NATIVE_COLOR = "#7b4173"  # plum: green is the KV cache everywhere
MARGIN = 2.5  # log axes reach this factor beyond the outermost point (or the ridge / the peak)
# The roofline's point names stay English (the colours read them, and tables key on them); these
# are the names drawn (`point_name`), and the engine's two `timed_by` texts, as shown in the title.
POINT_NAMES = {name: name for name in (
    N_("prefill"), N_("decode (median step)"), N_("decode, eager (static cache)"),
    N_("decode, compiled"), N_("decode, native C"))}
TIMED_BY = (N_("model forward only (synchronized)"),
            N_("whole step: forward + sampling + recording (this trace has no forward-only times)"))
TIMELINE_ROWS = {"tokenize": N_("tokenize"), "prefill": N_("prefill"), "decode": N_("decode")}


def point_name(name: str) -> str:
    """A roofline point's name as drawn: translated when it is one of the known names."""
    return _(POINT_NAMES[name]) if name in POINT_NAMES else name


def timeline_chart(trace) -> go.Figure:
    """Tokenization, then prefill as one wide bar, then each decode step, on a time axis (ms)."""
    times = trace.token_times_ms
    starts = [trace.tokenize_ms] + list(times[:-1])
    row = {key: _(name) for key, name in TIMELINE_ROWS.items()}  # the rows' names, as drawn
    fig = go.Figure()
    fig.add_trace(go.Bar(y=[row["tokenize"]], x=[trace.tokenize_ms], base=[0], orientation="h",
                         marker_color="#999", name=row["tokenize"],
                         hovertemplate=_("tokenize %{x:.1f} ms") + "<extra></extra>"))
    for phase, color in (("prefill", PREFILL_COLOR), ("decode", DECODE_COLOR)):
        idx = [i for i, s in enumerate(trace.steps) if s.phase == phase]
        fig.add_trace(go.Bar(
            y=[row[phase]] * len(idx), x=[trace.steps[i].latency_ms for i in idx],
            base=[starts[i] for i in idx], orientation="h", marker_color=color, name=row[phase],
            marker_line={"color": "white", "width": 1}, customdata=idx,
            hovertemplate=_("step %{customdata}: %{x:.1f} ms (from %{base:.0f} ms)")
            + "<extra></extra>"))
    fig.update_layout(barmode="overlay", height=220, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      showlegend=False)
    fig.update_xaxes(title_text=_("time since the request (ms)"))
    fig.update_yaxes(categoryorder="array",
                     categoryarray=[row["decode"], row["prefill"], row["tokenize"]])
    return fig


def tick_label(value: float) -> str:
    """A tick's value written out in full: 0.2, 5, 1,000 (never 2 for 0.2, never 1e+03)."""
    if value >= 1:
        return f"{value:,.0f}"
    return f"{value:.12f}".rstrip("0").rstrip(".")


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values for a log axis over [lo, hi]: 1, 2, 5 of each decade over up to 4 decades,
    decades only over more (every label then still states its own value)."""
    if not 0 < lo < hi:
        raise ValueError(f"a log axis needs 0 < lo < hi, got {lo}, {hi}")
    steps = (1, 2, 5) if math.log10(hi / lo) <= 4 else (1,)
    ticks = []
    for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in steps:
            value = float(f"{m}e{decade}")  # exact decimal (0.2, not 0.20000000000000004)
            if lo <= value <= hi:
                ticks.append(value)
    return ticks


def _log_axis(lo: float, hi: float) -> dict:
    ticks = log_ticks(lo, hi)
    return {"type": "log", "range": [math.log10(lo), math.log10(hi)], "tickmode": "array",
            "tickvals": ticks, "ticktext": [tick_label(v) for v in ticks]}


def _point_style(name: str) -> tuple[str, str]:
    """(colour, marker symbol) of a roofline point by its variant."""
    if "prefill" in name:
        return PREFILL_COLOR, "circle"
    if "compiled" in name:
        return COMPILED_COLOR, "diamond"
    if "native" in name:
        return NATIVE_COLOR, "square"
    if "eager" in name:
        return DECODE_COLOR, "triangle-up"
    return DECODE_COLOR, "circle"


def roofline_chart(ceil: Ceilings, points: dict[str, tuple[Work, float]],
                   timed_by: str = "") -> go.Figure:
    """Log-log roofline: attainable FLOP/s = min(peak, bandwidth × intensity); measured points.

    The axes span the points and the ridge (the roof's kink) with a margin, ticks are labelled
    with their own values, the ridge label sits at the ridge point, and the points are named in
    the legend (several decode variants share one intensity: text beside them would overlap).
    `timed_by` says which step time placed the trace's points (the title shows it)."""
    peak_g, bw = ceil.matmul_tflop_s * 1e3, ceil.bandwidth_gb_s  # GFLOP/s, GB/s
    placed = {name: (work.intensity, utilization(work, ms).flop_s / 1e9, ms)
              for name, (work, ms) in points.items() if work.intensity > 0}
    xs = [x for x, _y, _ms in placed.values()] + [ceil.ridge]
    ys = [y for _x, y, _ms in placed.values()] + [peak_g]
    x_lo, x_hi = min(xs) / MARGIN, max(xs) * MARGIN
    y_lo, y_hi = min(ys) / MARGIN, max(ys) * MARGIN
    fig = go.Figure(go.Scatter(
        x=[x_lo, ceil.ridge, x_hi], y=[bw * x_lo, peak_g, peak_g], mode="lines",
        name=_("roofline (measured)"), line={"color": "black"},
        hovertemplate=_("intensity %{x:.3g} FLOP/B<br>ceiling %{y:.3g} GFLOP/s")
        + "<extra></extra>"))
    fig.add_trace(go.Scatter(x=[ceil.ridge, ceil.ridge], y=[y_lo, peak_g], mode="lines",
                             line={"color": "grey", "dash": "dot"}, hoverinfo="skip",
                             showlegend=False, name=_("ridge")))
    for name, (x, y, ms) in placed.items():
        color, symbol = _point_style(name)
        fig.add_trace(go.Scatter(
            x=[x], y=[y], mode="markers", name=point_name(name),
            marker={"size": 13, "color": color, "symbol": symbol,
                    "line": {"color": "white", "width": 1}},
            hovertemplate=f"{point_name(name)}<br>"
            + _("intensity %{x:.3g} FLOP/B<br>achieved %{y:.3g} GFLOP/s")
            + f"<br>{ms:.1f} ms<extra></extra>"))
    # annotations on log axes take log10 coordinates: anchored at (ridge, peak)
    fig.add_annotation(x=math.log10(ceil.ridge), y=math.log10(peak_g), xref="x", yref="y",
                       text=_("ridge: {intensity} FLOP/B").format(intensity=f"{ceil.ridge:.3g}"),
                       showarrow=True, arrowhead=0,
                       ax=0, ay=-28, font={"size": 12})
    title = _("Step times: {timed_by}").format(timed_by=_(timed_by)) if timed_by else ""
    fig.update_layout(height=460, margin={"l": 10, "r": 10, "t": 40 if title else 20, "b": 10},
                      title={"text": title, "font": {"size": 13}},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0})
    fig.update_xaxes(title_text=_("arithmetic intensity (FLOP per byte moved)"),
                     **_log_axis(x_lo, x_hi))
    fig.update_yaxes(title_text=_("achieved (GFLOP/s)"), **_log_axis(y_lo, y_hi))
    return fig


def _spread(values: list[float], low: list[float], high: list[float]) -> dict:
    return {"type": "data", "symmetric": False, "thickness": 1.5, "width": 6,
            "array": [h - v for v, h in zip(values, high)],
            "arrayminus": [v - lo for v, lo in zip(values, low)]}


def sweep_chart(points, x_title: str, y_title: str, rate: bool = False) -> go.Figure:
    """The median of each size's repeats, with their min–max spread as error bars; `rate` plots
    tokens/s instead of milliseconds (a rate is k / time at a fixed size: the fastest repeat
    gives the highest rate)."""
    med = [p.tokens_per_s if rate else p.ms for p in points]
    fast = [p.tokens_per_s * p.ms / p.ms_min if rate else p.ms_min for p in points]
    slow = [p.tokens_per_s * p.ms / p.ms_max if rate else p.ms_max for p in points]
    low, high = (slow, fast) if rate else (fast, slow)
    counts = [max(len(p.repeats_ms), 1) for p in points]
    fig = go.Figure(go.Scatter(
        x=[p.size for p in points], y=med, mode="lines+markers", name=_("median of the repeats"),
        error_y=_spread(med, low, high), customdata=list(zip(low, high, counts)),
        hovertemplate=_("%{x}: median %{y:.1f} (min–max %{customdata[0]:.1f}–%{customdata[1]:.1f},"
                        " %{customdata[2]} repeats)") + "<extra></extra>"))
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      title={"text": _("median of the repeats; bars: min–max"),
                             "font": {"size": 12}})
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    return fig


def dtype_chart(comparison) -> go.Figure:
    """Median per-token decode time per weights dtype, bars: min–max over the rounds."""
    names = [r.dtype for r in comparison.runs]
    med = [r.itl_ms for r in comparison.runs]
    fig = go.Figure(go.Bar(
        x=names, y=med, marker_color=DECODE_COLOR, name=_("median over rounds"),
        error_y=_spread(med, [min(r.round_ms) for r in comparison.runs],
                        [max(r.round_ms) for r in comparison.runs]),
        customdata=[r.ratio for r in comparison.runs],
        hovertemplate=_("%{x}: %{y:.1f} ms per token (%{customdata:.2f}× float32's time)")
        + "<extra></extra>"))
    fig.update_layout(height=280, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      title={"text": _("median of the rounds; bars: min–max"),
                             "font": {"size": 12}})
    fig.update_xaxes(title_text=_("weights dtype"))
    fig.update_yaxes(title_text=_("decode step (ms per token)"), rangemode="tozero")
    return fig
