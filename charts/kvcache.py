"""Figures for the KV-cache page."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from engine.kv.kvcache import CacheConfig
from engine.kv.paging import PagedLayout
from engine.records.trace import Trace
from engine.serving.record import ServingRun
from i18n import _

from .attention import HEAD_COLORS
from .live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR
from .serving import SHARED_PATTERN, block_owners, request_color

ATTENTION_COLORS = {"MHA": "#d62728", "GQA": "#1f77b4", "MLA": "#2ca02c"}
# One colour per cache variant, in every figure of the page (the KL chart leaves the full cache
# out, so a colour by position would shift between the KL and the memory chart).
VARIANT_COLORS = {"full": "#444444", "int8": "#ff7f0e", "int4": "#d62728",
                  "window + sinks": "#2ca02c", "window": "#9467bd"}
UNUSED_COLOR = "#e6e6e6"
NAME_CHARS = 28  # model names on the calculator's axis; the full name is in the hover
MIB_FROM = 10 * 2**20  # the live-memory chart counts in MiB from 10 MiB (below: KiB)


def variant_color(config: CacheConfig) -> str:
    """The colour of a cache variant (full, int8, int4, window with or without sinks)."""
    if config.kind == "window":
        return VARIANT_COLORS["window + sinks" if config.sinks else "window"]
    return VARIANT_COLORS[config.kind]


def short_name(name: str, limit: int = NAME_CHARS) -> str:
    """A name cut in the middle, so both its start and its end (" (loaded)") stay readable."""
    if len(name) <= limit:
        return name
    tail = (limit - 1) * 2 // 3
    return name[:limit - 1 - tail] + "…" + name[-tail:]


def live_memory_chart(trace: Trace) -> go.Figure:
    """Measured KV bytes per step (from the tensors) and the formula, which must coincide. In KiB,
    or in MiB once the cache reaches MIB_FROM (an 8B model's 565 tokens: 141 MiB, not "150k KiB")."""
    steps = trace.steps
    formula = [trace.model.kv_bytes(s.context_len) if trace.settings.kv_cache else 0 for s in steps]
    largest = max([s.kv_bytes for s in steps] + formula, default=0)
    unit, title = (2**20, _("KV cache (MiB)")) if largest >= MIB_FROM else (1024, _("KV cache (KiB)"))
    fig = go.Figure([
        go.Scatter(x=[s.index for s in steps], y=[s.kv_bytes / unit for s in steps],
                   mode="markers", name=_("measured (tensor nbytes)"),
                   marker={"color": KV_COLOR, "size": 9}),
        go.Scatter(x=[s.index for s in steps], y=[f / unit for f in formula], mode="lines",
                   name=_("formula"), line={"color": "black", "dash": "dot"})])
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.1})
    fig.update_xaxes(title_text=_("step (0 = prefill of the whole prompt)"))
    fig.update_yaxes(title_text=title, rangemode="tozero")
    return fig


def on_off_chart(on_ms: np.ndarray, off_ms: np.ndarray) -> go.Figure:
    fig = go.Figure([
        go.Scatter(y=on_ms, mode="lines", name=_("cache on"), line={"color": DECODE_COLOR}),
        go.Scatter(y=off_ms, mode="lines", name=_("cache off (recompute everything)"),
                   line={"color": PREFILL_COLOR})])
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.1})
    fig.update_xaxes(title_text=_("step (0 = prefill)"))
    fig.update_yaxes(title_text=_("step time (ms)"), rangemode="tozero")
    return fig


DELAYED_SYMBOL = "x-thin-open"  # a round the delay rule marked, in every on/off chart


def on_off_rounds_chart(results) -> go.Figure:
    """Total time per output length with the cache and without: the median of the rounds, bars
    from the fastest to the slowest round, and every round as a small point (a cross: delayed by
    other work on the machine, engine/timing/disturbance.py)."""
    ordered = sorted(results, key=lambda r: r.new_tokens)
    fig = go.Figure()
    for cache, name, color in ((True, _("cache on"), DECODE_COLOR),
                               (False, _("cache off (recompute everything)"), PREFILL_COLOR)):
        x = [r.new_tokens for r in ordered]
        med = [r.median_ms(cache) for r in ordered]
        low, high = zip(*(r.spread_ms(cache) for r in ordered)) if ordered else ((), ())
        fig.add_trace(go.Scatter(
            x=x, y=med, mode="lines+markers", name=_("{name}: median").format(name=name),
            legendgroup=name,
            line={"color": color}, marker={"size": 9},
            error_y={"type": "data", "symmetric": False, "thickness": 1.5, "width": 6,
                     "array": [h - m for m, h in zip(med, high)],
                     "arrayminus": [m - lo for m, lo in zip(med, low)]},
            customdata=[[lo, hi, r.rounds] for lo, hi, r in zip(low, high, ordered)],
            hovertemplate=_("%{x} tokens: median %{y:,.0f} ms (min–max %{customdata[0]:,.0f}–"
                            "%{customdata[1]:,.0f} ms, %{customdata[2]} rounds)<extra></extra>")))
        points = [(r.new_tokens, total, i, r.measured and (r.on_delayed if cache
                                                            else r.off_delayed)[i])
                  for r in ordered for i, total in enumerate(r.totals(cache))]  # (x, ms, round, delayed)
        if points and len(points) > len(ordered):
            fig.add_trace(go.Scatter(
                x=[p[0] for p in points], y=[p[1] for p in points], mode="markers",
                name=_("{name}: each round").format(name=name), legendgroup=name,
                showlegend=False,
                marker={"color": color, "size": [10 if p[3] else 5 for p in points],
                        "symbol": [DELAYED_SYMBOL if p[3] else "circle" for p in points],
                        "line": {"color": color, "width": 2}},
                customdata=[[p[2] + 1, _("delayed by other work") if p[3] else ""]
                            for p in points],
                hovertemplate=_("%{x} tokens, round %{customdata[0]}: %{y:,.0f} ms "
                                "%{customdata[1]}<extra></extra>")))
    if any(r.delayed_rounds for r in ordered):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers",
                                 name=_("round delayed by other work"),
                                 marker={"symbol": DELAYED_SYMBOL, "size": 10, "color": "#444444",
                                         "line": {"width": 2}}))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0})
    fig.update_xaxes(title_text=_("new tokens"), tickvals=[r.new_tokens for r in ordered])
    fig.update_yaxes(title_text=_("total time (ms)"), rangemode="tozero")
    return fig


def per_token_bars(names: list[str], kinds: list[str], values: list[float]) -> go.Figure:
    """Horizontal bars, one per model, coloured by attention type (legend): a long model name
    is cut on the axis (full in the hover), so it cannot squeeze the plot."""
    fig = go.Figure()
    for kind, color in ATTENTION_COLORS.items():
        rows = [i for i, k in enumerate(kinds) if k == kind]
        if rows:
            fig.add_trace(go.Bar(
                y=[names[i] for i in rows], x=[values[i] / 1024 for i in rows], orientation="h",
                name=kind, marker_color=color, customdata=[kind] * len(rows),
                hovertemplate=_("%{y} (%{customdata})<br>%{x:,.1f} KiB per token"
                                "<extra></extra>")))
    fig.update_layout(height=80 + 34 * len(names), margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0,
                              "title_text": _("attention:")})
    fig.update_yaxes(categoryorder="array", categoryarray=names, autorange="reversed",
                     tickvals=names, ticktext=[short_name(n) for n in names])
    fig.update_xaxes(title_text=_("KV cache per token (KiB)"), rangemode="tozero")
    return fig


def variant_chart(runs, field: str, title: str, scale: float = 1.0) -> go.Figure:
    """One line per cache variant, in that variant's colour (`variant_color`)."""
    fig = go.Figure()
    for run in runs:
        fig.add_trace(go.Scatter(y=getattr(run, field) / scale, mode="lines", name=run.config.label,
                                 line={"color": variant_color(run.config)}))
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.12})
    fig.update_xaxes(title_text=_("generated token"))
    fig.update_yaxes(title_text=title, rangemode="tozero")
    return fig


def blocks_chart(layout: PagedLayout, names: list[str]) -> go.Figure:
    """Physical blocks in allocation order: a bar per block in its sequence's colour, as high as
    the token slots it uses, and the slots it leaves unused stacked in grey (the legend says
    which is which)."""
    owner, used, labels = {}, {}, {}
    for seq, table in enumerate(layout.block_tables):
        for logical, physical in enumerate(table):
            owner[physical] = seq
            used[physical] = min(layout.block_size, layout.lengths[seq] - logical * layout.block_size)
            labels[physical] = _("{name} · logical block {logical} · {used}/{size} slots "
                                 "used").format(name=names[seq], logical=logical,
                                                used=used[physical], size=layout.block_size)
    fig = go.Figure()
    for seq, name in enumerate(names):
        xs = [p for p in sorted(owner) if owner[p] == seq]
        if xs:
            fig.add_trace(go.Bar(x=xs, y=[used[p] for p in xs], name=name,
                                 marker_color=HEAD_COLORS[seq % len(HEAD_COLORS)],
                                 hovertext=[labels[p] for p in xs], hoverinfo="text"))
    xs = [p for p in sorted(owner) if used[p] < layout.block_size]
    fig.add_trace(go.Bar(x=xs, y=[layout.block_size - used[p] for p in xs],
                         name=_("unused slots (wasted)"), marker={"color": UNUSED_COLOR,
                                                                  "line": {"color": "#999999",
                                                                           "width": 1}},
                         hovertext=[_("block {block}: {n} slots unused").format(
                             block=p, n=layout.block_size - used[p]) for p in xs],
                         hoverinfo="text"))
    fig.add_hline(y=layout.block_size, line_dash="dot",
                  annotation_text=_("block size ({n} slots)").format(n=layout.block_size))
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 30, "b": 10}, bargap=0.05,
                      barmode="stack", legend={"orientation": "h", "y": 1.02, "yanchor": "bottom",
                                               "x": 0, "title_text": _("block of:"),
                                               "traceorder": "normal"})
    fig.update_xaxes(title_text=_("physical block id (allocation order)"))
    fig.update_yaxes(title_text=_("token slots"), range=[0, layout.block_size * 1.15])
    return fig


def recorded_blocks_chart(run: ServingRun, step: int) -> go.Figure:
    """The block pool of a recorded serving run after one step, drawn like `blocks_chart`: a bar
    per physical block in use, in its request's colour (the Serving page's) and as high as the
    tokens it holds, its unused slots stacked in grey; a block shared by several requests
    (prefix sharing) is hatched and named in the hover."""
    chosen = run.steps[step]
    size = run.config.block_size
    owners = block_owners(chosen, size)
    fig = go.Figure()
    for request in sorted({r for held in owners.values() for r, __, ___ in held[:1]}):
        xs = sorted(b for b, held in owners.items() if held[0][0] == request)
        fig.add_trace(go.Bar(
            x=xs, y=[owners[b][0][2] for b in xs], name=_("request {id}").format(id=request),
            marker={"color": request_color(request), "pattern": {
                "shape": [SHARED_PATTERN if len(owners[b]) > 1 else "" for b in xs],
                "fgcolor": "#000000", "size": 6, "fillmode": "overlay"}},
            hovertext=[(_("block {block}: shared by requests {requests} · {used}/{size} slots "
                          "used").format(block=b, requests=", ".join(
                              str(r) for r, __, ___ in owners[b]), used=owners[b][0][2], size=size)
                        if len(owners[b]) > 1 else
                        _("block {block}: request {request}, logical block {logical} · "
                          "{used}/{size} slots used").format(
                            block=b, request=request, logical=owners[b][0][1],
                            used=owners[b][0][2], size=size)) for b in xs], hoverinfo="text"))
    xs = sorted(b for b, held in owners.items() if held[0][2] < size)
    fig.add_trace(go.Bar(x=xs, y=[size - owners[b][0][2] for b in xs],
                         name=_("unused slots (wasted)"),
                         marker={"color": UNUSED_COLOR, "line": {"color": "#999999", "width": 1}},
                         hovertext=[_("block {block}: {n} slots unused").format(
                             block=b, n=size - owners[b][0][2]) for b in xs],
                         hoverinfo="text"))
    if any(len(held) > 1 for held in owners.values()):
        fig.add_trace(go.Bar(x=[None], y=[None], name=_("shared (hatched)"), hoverinfo="skip",
                             marker={"color": "#ffffff", "line": {"color": "#000000", "width": 1},
                                     "pattern": {"shape": SHARED_PATTERN, "fgcolor": "#000000"}}))
    fig.add_hline(y=size, line_dash="dot",
                  annotation_text=_("block size ({n} slots)").format(n=size))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 30, "b": 10}, bargap=0.05,
                      barmode="stack", legend={"orientation": "h", "y": 1.02, "yanchor": "bottom",
                                               "x": 0, "title_text": _("block of:"),
                                               "traceorder": "normal"})
    fig.update_xaxes(title_text=_("physical block id (of {blocks}; recorded after step "
                                  "{step})").format(blocks=run.config.num_blocks,
                                                    step=chosen.index))
    fig.update_yaxes(title_text=_("token slots"), range=[0, size * 1.15])
    return fig
