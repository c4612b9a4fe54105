"""Figures of the Quantization page: the study's one chart, and the weight-bytes calculator.

Pure functions of engine records (no Streamlit, no model), tested on their data and layout.
Colours mean one thing each: the variant's stored bytes brown, what one decode step reads teal,
an ITL measured on the native C step plum and on torch eager blue (as on the Prefill vs decode
page's kernel comparison; hatched, as on the live chart, when other programs used the CPUs
meanwhile), KL pink; the calculator's formats one colour each.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.quant.calculator import GroupOverhead, ModelWeights
from engine.quant.drift import DriftStudy
from engine.quant.study import QuantStudy, shown_note
from i18n import N_, _

from .live import DELAYED_NAME, DELAYED_PATTERN
from .timing import DECODE_COLOR, NATIVE_COLOR

STORED_COLOR = "#8c564b"  # the variant's weights as stored (codes + scales + the rest)
READ_COLOR = "#17becf"  # bytes one decode step reads (what ITL follows)
KL_COLOR = "#e377c2"
ITL_COLORS = {"native": NATIVE_COLOR, "torch eager": DECODE_COLOR}
FORMAT_COLORS = {"fp32": "#444444", "fp16": "#1f77b4", "bf16": "#17becf", "int8": "#ff7f0e",
                 "int4": "#d62728", "q4_0": "#d62728", "q4_1": "#9467bd", "q3": "#8c564b",
                 "q2": "#7f7f7f"}
NO_DRIFT = 1e-9  # nats: a variant whose lens KL never grows more than this has no ring
OTHER_COLORS = ("#2ca02c", "#bcbd22", "#e377c2", "#1f77b4", "#ff9896", "#aec7e8", "#98df8a")
ROW_TITLES = (N_("weights (MB)"), N_("ITL (ms per token)"), N_("KL vs fp32 (nats)"))
# the decoders that time a step, as the legend names them ("torch eager": torch's own mode name)
DECODER_NAMES = {"native": N_("ITL, native"), "torch eager": N_("ITL, torch eager")}
MB = 1e6


def _label(value: float, digits: int = 3) -> str:
    """A short bar label: `digits` significant figures, no exponent above 0.001 (0 stays '0',
    a tiny KL such as fp16's reads 4.1e-06 rather than 0.0000)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else "–"
    if abs(value) < 1e-3:
        return f"{value:.1e}"
    decimals = max(digits - 1 - math.floor(math.log10(abs(value))), 0)
    return f"{value:.{min(decimals, 4)}f}"


def study_chart(study: QuantStudy) -> go.Figure:
    """Per variant (x, in the study's order), three panels sharing the axis: the weights as
    stored and what one decode step reads (MB), ITL (ms, coloured by the decoder that ran it),
    and the mean KL divergence from fp32 (nats). Bytes fall, ITL should follow what is read."""
    names = [v.name for v in study.variants]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07)
    stored = [v.report.nbytes / MB for v in study.variants]
    read = [v.speed.bytes_per_step / MB for v in study.variants]
    fig.add_trace(go.Bar(x=names, y=stored, name=_("stored (codes + scales + rest)"),
                         marker_color=STORED_COLOR, text=[_label(b) for b in stored],
                         textposition="outside", cliponaxis=False, legendgroup="bytes",
                         hovertemplate=_("%{x}: %{y:.1f} MB stored<extra></extra>")), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=read, name=_("read per decode step"),
                         marker_color=READ_COLOR, text=[_label(b) for b in read],
                         textposition="outside", cliponaxis=False, legendgroup="bytes",
                         hovertemplate=_("%{x}: %{y:.1f} MB read per step<extra></extra>")),
                  row=1, col=1)
    for decoder, color in ITL_COLORS.items():
        rows = [v for v in study.variants if v.speed.decoder == decoder]
        if rows:
            fig.add_trace(go.Bar(
                x=[v.name for v in rows], y=[v.speed.itl_ms for v in rows],
                name=_(DECODER_NAMES[decoder]),
                marker={"color": color, "pattern": {
                    "shape": [DELAYED_PATTERN if v.speed.disturbed else "" for v in rows],
                    "fgcolor": "white", "size": 6, "fillmode": "overlay"}},
                text=[_label(v.speed.itl_ms) for v in rows], textposition="outside",
                cliponaxis=False,
                customdata=[_("{note} · timed while other programs used {share} of the "
                              "CPUs").format(note=shown_note(v.speed.note),
                                             share=f"{v.speed.others_share:.0%}")
                            if v.speed.disturbed else shown_note(v.speed.note) for v in rows],
                hovertemplate=_("%{x}: %{y:.2f} ms per token<br>%{customdata}<extra></extra>")),
                row=2, col=1)
    if any(v.speed.disturbed for v in study.variants):  # a legend entry for the hatching
        fig.add_trace(go.Bar(x=[None], y=[None], name=_(DELAYED_NAME), marker={
            "color": "#7f7f7f", "pattern": {"shape": DELAYED_PATTERN, "fgcolor": "white",
                                            "fillmode": "overlay"}}, hoverinfo="skip"),
            row=2, col=1)
    kl = [v.kl_mean for v in study.variants]
    fig.add_trace(go.Bar(x=names, y=kl, name="KL(fp32 ‖ variant)", marker_color=KL_COLOR,
                         text=[_label(k, 2) for k in kl], textposition="outside",
                         cliponaxis=False,
                         hovertemplate=_("%{x}: mean KL %{y:.4f} nats<extra></extra>")),
                  row=3, col=1)
    top = {1: max(stored + read), 2: max(v.speed.itl_ms for v in study.variants), 3: max(kl)}
    for row, title in enumerate(ROW_TITLES, start=1):
        # room above the tallest bar for its label; an all-zero panel still gets an axis
        fig.update_yaxes(title_text=_(title), range=[0, (top[row] or 1) * 1.25], row=row, col=1)
    fig.update_xaxes(categoryorder="array", categoryarray=names, row=3, col=1,
                     title_text=_("weights variant"))
    fig.update_layout(height=680, barmode="group", bargap=0.25,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      title={"text": _("Bytes, speed and quality per weights variant"), "x": 0},
                      legend={"orientation": "h", "y": -0.11, "yanchor": "top", "x": 0})
    return fig


def calculator_chart(models: list[ModelWeights]) -> go.Figure:
    """GB of weights per format (one colour each), models as groups on the y axis: the
    explainer's 28 / 14 / 7 / 3.5 GB for 7B parameters, and any other count."""
    formats = list(dict.fromkeys(f for m in models for f in m.gigabytes))
    labels = [m.name for m in models]
    fig = go.Figure()
    for fmt in formats:
        fig.add_trace(go.Bar(
            y=labels, x=[m.gigabytes.get(fmt) for m in models], orientation="h", name=fmt,
            marker_color=FORMAT_COLORS.get(fmt, "#7f7f7f"),
            text=[_label(m.gigabytes[fmt]) if fmt in m.gigabytes else "" for m in models],
            textposition="outside", cliponaxis=False, textfont={"size": 12},
            constraintext="none",  # plotly would shrink a label to its bar's thickness
            hovertemplate=f"%{{y}}<br>{fmt}: %{{x:.2f}} GB<extra></extra>"))
    top = max((g for m in models for g in m.gigabytes.values()), default=1.0)
    fig.update_layout(height=120 + 17 * len(models) * max(len(formats), 1), barmode="group",
                      margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0,
                              "title_text": _("format:"), "traceorder": "normal"})
    fig.update_yaxes(categoryorder="array", categoryarray=labels, autorange="reversed")
    fig.update_xaxes(title_text=_("weights (GB = 10⁹ bytes)"), range=[0, top * 1.18])
    return fig


def overhead_chart(rows: list[GroupOverhead], code_bits: int = 4) -> go.Figure:
    """Stored bits per weight against the group size, for `code_bits`-bit codes with a float16
    scale per group (Q4_0 idea) and with a scale and a minimum (Q4_1 idea)."""
    groups = [r.group for r in rows]
    fig = go.Figure()
    for zero_point, name, color in ((False, _("scale per group (Q4_0 idea)"), "#d62728"),
                                    (True, _("scale + minimum per group (Q4_1 idea)"), "#9467bd")):
        bits = [r.bits_per_weight(code_bits, zero_point) for r in rows]
        fig.add_trace(go.Scatter(
            x=groups, y=bits, name=name, mode="lines+markers+text", marker_color=color,
            line={"color": color}, text=[f"{b:g}" for b in bits],
            textposition="top center" if zero_point else "bottom center",
            hovertemplate=_("group %{x}: %{y:.3f} bits per weight<extra></extra>")))
    top = max(r.bits_per_weight(code_bits, True) for r in rows) if rows else code_bits + 1
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0})
    fig.update_xaxes(title_text=_("weights per group (log scale)"), type="log", tickvals=groups,
                     ticktext=[str(g) for g in groups])
    fig.update_yaxes(title_text=_("stored bits per weight ({bits}-bit codes)").format(
                         bits=code_bits),
                     range=[code_bits - 0.4, top + 0.5])
    return fig


def variant_colors(names: list[str]) -> dict[str, str]:
    """One colour per variant: the calculator's for its format, distinct others for the rest."""
    spare = iter(c for c in OTHER_COLORS if c not in {FORMAT_COLORS.get(n) for n in names})
    return {n: FORMAT_COLORS.get(n) or next(spare, "#7f7f7f") for n in names}


def drift_chart(study: DriftStudy) -> go.Figure:
    """Layers on x (0 = the embedding output, l = after decoder layer l), one line per variant
    (one colour each, in both panels): the logit lens's KL from fp32 (nats) above, the residual
    stream's cosine to fp32 below. A ring marks, per variant that drifts at all, the layer its
    KL grows the most."""
    layers = list(range(study.layers + 1))
    colors = variant_colors([d.variant for d in study.variants])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12)
    for d in study.variants:
        color = colors[d.variant]
        fig.add_trace(go.Scatter(
            x=layers, y=d.kl, name=d.variant, mode="lines+markers", legendgroup=d.variant,
            line={"color": color, "width": 3}, marker={"size": 6, "color": color},
            hovertemplate=_("{variant} · layer %{x}: lens KL %{y:.4g} nats<extra></extra>")
            .replace("{variant}", d.variant)),
            row=1, col=1)
        fig.add_trace(go.Scatter(
            x=layers, y=d.cosine, name=d.variant, mode="lines+markers", legendgroup=d.variant,
            showlegend=False, line={"color": color, "width": 3}, marker={"size": 6, "color": color},
            hovertemplate=_("{variant} · layer %{x}: cosine %{y:.5f}<extra></extra>")
            .replace("{variant}", d.variant)),
            row=2, col=1)
        layer, growth = d.fastest
        if growth <= NO_DRIFT:
            continue
        fig.add_trace(go.Scatter(
            x=[layer], y=[d.kl[layer]], mode="markers", legendgroup=d.variant, showlegend=False,
            marker={"size": 16, "color": "rgba(0,0,0,0)", "line": {"color": color, "width": 3}},
            hovertemplate=_("{variant}: fastest growth at layer {layer} (+{growth} nats)"
                            "<extra></extra>").format(variant=d.variant, layer=layer,
                                                      growth=f"{growth:.3g}")), row=1, col=1)
    fig.update_yaxes(title_text=_("lens KL vs fp32 (nats)"), rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=_("residual cosine to fp32"), row=2, col=1)
    fig.update_xaxes(title_text=_("layer (0 = embeddings)"), dtick=5, row=2, col=1)
    fig.update_layout(height=560, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      legend={"orientation": "h", "y": 1.02, "x": 0, "title_text": _("weights:")},
                      hovermode="closest")
    return fig
