"""Figures for the Generate page: per-step latency with the KV cache, and a step's top-k."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.records.trace import Step, Trace
from engine.timing.disturbance import assess
from engine.timing.metrics import warmup_step
from i18n import N_, _

from .text import as_text
from .tokens import piece_text, visible

PREFILL_COLOR = "#d62728"
DECODE_COLOR = "#1f77b4"
KV_COLOR = "#2ca02c"
DELAYED_PATTERN = "x"  # hatching: a step delayed by other work on the machine (any phase)
# constants in English (N_): `_(DELAYED_NAME)`, `_(WARMUP_LABEL)` where they are drawn
DELAYED_NAME = N_("delayed by other work")
WARMUP_LABEL = N_("warm-up: left out of ITL")  # the first decode step the warm-up rule marks
PHASE_NAMES = {"prefill": N_("prefill"), "decode": N_("decode")}
STEP_NAMES = {"prefill": N_("prefill step"), "decode": N_("decode step")}


def _timing_note(step: Step, delayed: bool) -> str:
    if not delayed:
        return ""
    return "<br>" + _("<b>delayed by other work on this machine</b>: others used {share} of "
                      "the CPUs").format(share=f"{step.others_share:.0%}")


def step_chart(trace: Trace) -> go.Figure:
    """One bar per step (prefill distinct from decode), KV-cache bytes as a second series; steps
    other work on the machine delayed (engine/timing/disturbance.py) are hatched, and a first
    decode step the warm-up rule marks (engine/timing/metrics.py) is labelled so."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    steps = trace.steps
    delayed = set(assess(trace).delayed_steps)
    for phase, color in (("prefill", PREFILL_COLOR), ("decode", DECODE_COLOR)):
        for hatched in (False, True):  # two traces, so the legend's swatch is the plain colour
            chosen = [s for s in steps if s.phase == phase and (s.index in delayed) == hatched]
            if hatched and not chosen:
                continue
            # plotly leaves an empty trace out of the legend; [None] keeps the phase's entry
            fig.add_trace(go.Bar(
                x=[s.index for s in chosen] or [None], y=[s.latency_ms for s in chosen] or [None],
                name=_(STEP_NAMES[phase]), legendgroup=phase, showlegend=not hatched,
                marker={"color": color, "pattern": {
                    "shape": DELAYED_PATTERN if hatched else "", "fgcolor": "white", "size": 6,
                    "fillmode": "overlay"}},
                customdata=[[as_text(visible(piece_text(s.piece))), s.context_len,
                             _timing_note(s, hatched)] for s in chosen],
                hovertemplate=_("step %{x}<br>%{y:.1f} ms<br>token %{customdata[0]}"
                                "<br>context %{customdata[1]} tokens%{customdata[2]}")
                              + "<extra>" + _(PHASE_NAMES[phase]) + "</extra>"),
                secondary_y=False)
    warm = warmup_step(trace)
    if warm is not None:  # the warm-up rule (engine/timing/metrics.py): named on the bar
        # the label runs rightwards from the bar: step 1 sits by the axis, whose ticks and title
        # a centred label covered (seen at 390 px, and over "1000" in Chinese at 1440)
        fig.add_annotation(x=warm, y=steps[warm].latency_ms, text=_(WARMUP_LABEL), showarrow=True,
                           arrowhead=0, ax=0, ay=-30, xanchor="left",
                           font={"size": 12, "color": "#444444"},
                           bgcolor="rgba(255, 255, 255, 0.9)", yref="y", xref="x")
    if delayed:  # a legend entry for the hatching (no data of its own)
        fig.add_trace(go.Bar(x=[None], y=[None], name=_(DELAYED_NAME), marker={
            "color": "#7f7f7f", "pattern": {"shape": DELAYED_PATTERN, "fgcolor": "white",
                                            "fillmode": "overlay"}},
            hoverinfo="skip"), secondary_y=False)
    fig.add_trace(go.Scatter(
        x=[s.index for s in steps], y=[s.kv_bytes / 1024 for s in steps], name=_("KV cache"),
        mode="lines+markers", line={"color": KV_COLOR},
        hovertemplate=_("step %{x}<br>KV cache %{y:,.0f} KiB") + "<extra></extra>"),
        secondary_y=True)
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 30, "b": 10}, bargap=0.15,
                      barmode="overlay",
                      legend={"orientation": "h", "y": 1.12}, hovermode="closest")
    # whole steps only (a run of one or two steps showed ticks at −0.4 … 0.4), at least 5 wide
    fig.update_xaxes(title_text=_("step (0 = prefill of the whole prompt)"),
                     range=[-0.5, max(len(steps) - 0.5, 4.5)], tick0=0,
                     dtick=next(d for d in (1, 2, 5, 10, 20, 50, 100, 10**9)
                                if len(steps) <= 12 * d))
    fig.update_yaxes(title_text=_("step latency (ms)"), secondary_y=False)
    fig.update_yaxes(title_text=_("KV cache (KiB)"), secondary_y=True, rangemode="tozero")
    return fig


def empty_step_chart() -> go.Figure:
    """The step chart's axes before any step: drawn when the page opens, so the browser has
    loaded and laid out its charting library before the model runs — done during the first
    decode step instead, that work competes with the model for the cores and makes the step
    look several times slower than the next ones (the first-decode-step spike)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=[], y=[], name=_(STEP_NAMES["prefill"]), marker_color=PREFILL_COLOR))
    fig.add_trace(go.Bar(x=[], y=[], name=_(STEP_NAMES["decode"]), marker_color=DECODE_COLOR))
    fig.add_trace(go.Scatter(x=[], y=[], name=_("KV cache"), line={"color": KV_COLOR}),
                  secondary_y=True)
    fig.add_annotation(text=_("each step's latency appears here while the model runs"),
                       xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font={"color": "#7f7f7f"})
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": 1.12})
    fig.update_xaxes(title_text=_("step (0 = prefill of the whole prompt)"), range=[-0.5, 10.5])
    fig.update_yaxes(title_text=_("step latency (ms)"), secondary_y=False, range=[0, 100])
    fig.update_yaxes(title_text=_("KV cache (KiB)"), secondary_y=True, range=[0, 100])
    return fig


def topk_chart(step: Step) -> go.Figure:
    """The model's top candidates at one step, the chosen token marked."""
    labels = [f"{rank + 1}. {as_text(visible(piece_text(p)))}" for rank, p in enumerate(step.top_pieces)]
    chosen = [int(t) == step.token_id for t in step.top_ids]
    fig = go.Figure(go.Bar(
        x=[float(p) for p in step.top_probs], y=labels, orientation="h",
        marker_color=[PREFILL_COLOR if c else "#9ecae1" for c in chosen],
        text=[_("chosen · {p}").format(p=f"{float(p):.1%}") if c else f"{float(p):.1%}"
              for c, p in zip(chosen, step.top_probs)],
        textposition="auto",
        hovertemplate=_("%{y}<br>probability %{x:.4f}") + "<extra></extra>"))
    fig.update_layout(height=60 + 28 * len(labels), margin={"l": 10, "r": 10, "t": 10, "b": 10})
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text=_("probability (model distribution, temperature 1)"), range=[0, 1])
    return fig
