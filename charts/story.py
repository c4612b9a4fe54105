"""Figures only the guided story needs (pages/story.py); its other stages reuse the pages' own
charts. Pure functions of numbers from a trace: no Streamlit here."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from engine.records.trace import Step
from i18n import _

from .formatting import size
from .live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR, topk_chart
from .text import as_text
from .tokens import piece_text, visible

ATTENTION_COLOR = DECODE_COLOR
FFN_COLOR = KV_COLOR
RUN_COLOR = DECODE_COLOR  # the weights this run's decode steps read
OTHER_FORMAT_COLOR = "#c7c7c7"  # the formats it did not use


def next_token_chart(step: Step) -> go.Figure:
    """The step's recorded top candidates (charts.live.topk_chart), plus the token it actually
    took as a last red bar when sampling picked one outside them — otherwise the chosen token
    would be missing from the very chart that is about it."""
    fig = topk_chart(step)
    if any(int(i) == step.token_id for i in step.top_ids):
        return fig
    bar = fig.data[0]
    label = f"{step.chosen_rank + 1}. {as_text(visible(piece_text(step.piece)))}"
    bar.x = (*bar.x, step.chosen_prob)
    bar.y = (*bar.y, label)
    bar.marker.color = (*bar.marker.color, PREFILL_COLOR)
    bar.text = (*bar.text, _("chosen · {probability}").format(probability=f"{step.chosen_prob:.2g}"))
    fig.update_layout(height=60 + 28 * len(bar.y))
    return fig


def layer_split_chart(attention_params: float, ffn_params: float) -> go.Figure:
    """One transformer layer's parameters as a single bar: attention's projections, then the FFN
    (with the layer's norms), in millions, each part labelled with its share."""
    total = attention_params + ffn_params
    fig = go.Figure()
    for name, value, color in ((_("attention: q, k, v, o projections"), attention_params, ATTENTION_COLOR),
                               (_("feed-forward network (and the two norms)"), ffn_params, FFN_COLOR)):
        fig.add_trace(go.Bar(  # the names in the legend: inside a quarter of the bar they would not fit
            x=[value / 1e6], y=[_("one layer")], orientation="h", name=name, marker_color=color,
            text=[f"{value / 1e6:.2f} M ({value / total:.0%})"], textposition="inside",
            insidetextanchor="middle", textfont={"color": "white"},
            hovertemplate=name + "<br>" + _("%{x:.3f} M parameters") + "<extra></extra>"))
    fig.update_layout(barmode="stack", height=200, legend={"orientation": "h", "y": 1.02,
                                                           "yanchor": "bottom", "x": 0},
                      margin={"l": 10, "r": 10, "t": 10, "b": 10})
    fig.update_xaxes(title_text=_("parameters in one layer (millions)"), range=[0, total / 1e6])
    fig.update_yaxes(showticklabels=False)
    return fig


def residual_norm_chart(norms: Sequence[float]) -> go.Figure:
    """‖x‖ of the residual stream at one position: after the embedding, then after each layer,
    the last included (engine.lens.notice.residual_norms)."""
    labels = [_("embedding")] + [_("layer {i}").format(i=i) for i in range(len(norms) - 1)]
    fig = go.Figure(go.Scatter(
        x=labels, y=list(norms), mode="lines+markers", line={"color": FFN_COLOR},
        hovertemplate=_("after %{x}<br>‖x‖ = %{y:.2f}<extra></extra>")))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_xaxes(title_text=_("residual stream after … (the prompt's last position)"))
    fig.update_yaxes(title_text=_("‖x‖ (L2 norm)"), rangemode="tozero")  # fits 320 px at 22 px
    return fig


def weights_step_chart(labels: Sequence[str], step_bytes: Sequence[float], run: int,
                       measured: float | None = None) -> go.Figure:
    """Weight bytes one decode step reads in each format (engine.lens.weights_notice.step_bytes),
    the run's own format (`run`, an index into `labels`) in decode blue and named so; when the
    native step ran, its measured bytes are written on that bar under the formula's (a marker
    would sit on the bar's own label: the two differ by a fraction of a percent). Formats counted
    as 0 (a name the calculator does not know) are left out. MiB, or GiB past 1 GiB a step."""
    unit, factor = ("GiB", 2**30) if max(step_bytes) >= 2**30 else ("MiB", 2**20)
    kept = [i for i, b in enumerate(step_bytes) if b > 0]
    names = [_("{format} — this run").format(format=labels[i]) if i == run else labels[i]
             for i in kept]
    text = [size(step_bytes[i]) + ("<br>" + _("measured: {size}").format(size=size(measured))
                                   if i == run and measured else "") for i in kept]
    per_step = (_("%{y:.1f} GiB per decode step (formula)") if unit == "GiB"
                else _("%{y:.1f} MiB per decode step (formula)"))
    fig = go.Figure(go.Bar(
        x=names, y=[step_bytes[i] / factor for i in kept], text=text, textposition="outside",
        cliponaxis=False,
        marker_color=[RUN_COLOR if i == run else OTHER_FORMAT_COLOR for i in kept],
        hovertemplate="%{x}<br>" + per_step + "<extra></extra>"))
    fig.update_layout(height=340, showlegend=False, bargap=0.35,
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    fig.update_xaxes(title_text=_("weights stored as … (bits per weight, with scales)"))  # fits a phone
    fig.update_yaxes(title_text=_("weights read per step ({unit})").format(unit=unit),
                     range=[0, max(step_bytes) / factor * 1.2])
    return fig
