"""Attention figures: each takes arrays and labels (engine/lens/attention_stats.py builds them from a
Trace) and checks their shapes with a precise ValueError.

`weights` below is one layer's (H, S, S) matrix from `full_attention`: query rows × key columns,
NaN where causally masked; S = T prompt tokens + decode steps, T ≥ 1.
"""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from engine.records.trace import Trace
from i18n import _

from .text import as_text
from .tokens import piece_text, visible

MASKED_COLOR = "#d9d9d9"  # cells a causal model cannot attend to (future tokens)
MARK_COLOR = "#ff2d55"  # the model view's outline of the layer and head chosen above
HEAD_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"]
ROW_PX = 18  # heatmap: px a query row, room for its 12 px label
CHAR_PX = 6.5  # px a character of a 12 px tick label takes (Source Sans, upper bound)
LABEL_CHARS = 40  # tick labels longer than this are not given more room
HEATMAP_FRAME_PX = 100  # title, axis title and their padding
MAX_HEIGHT = 700  # px: a chart fits a 1440×900 screen below the page's selectors
HEAD_VIEW_ROWS = 36  # key rows in the head view; at ~18 px each they fit MAX_HEIGHT
MAX_FRAMES = 100  # decode-step animation: at 0.3 s a frame, Play ends within 30 s …
MAX_FRAME_VALUES = 1_000_000  # … and its frames hold at most 4 MB of float32 weights


def sequence_names(trace: Trace) -> list[str]:
    """Every position that has an attention row as plain text, "i:piece" (the prompt, then
    fed-back outputs): for a table's cells, which show text as it is (no markup, no references)."""
    pieces = list(trace.prompt_pieces) + [s.piece for s in trace.steps[:-1]]
    return [f"{i}:{visible(piece_text(p))}" for i, p in enumerate(pieces)]


def sequence_labels(trace: Trace) -> list[str]:
    """`sequence_names` made safe for the figures' text and for Markdown (a widget's options):
    see charts/text.py. A table shows these character references as typed: use the names."""
    return [as_text(name) for name in sequence_names(trace)]


def _check_weights(weights: np.ndarray, labels: Sequence[str]) -> tuple[int, int]:
    """(H, S) of an (H, S, S) weights array whose S matches the labels."""
    if weights.ndim != 3 or weights.shape[1] != weights.shape[2]:
        raise ValueError(f"weights must be (heads, S, S), got shape {weights.shape}")
    if len(labels) != weights.shape[-1]:
        raise ValueError(f"{len(labels)} labels for {weights.shape[-1]} positions")
    return weights.shape[0], weights.shape[-1]


def downsample(matrix: np.ndarray, labels: list[str], limit: int) -> tuple[np.ndarray, list[str], int]:
    """Mean-pool a square (S, S) matrix into ≤ limit × limit blocks (NaN-aware); returns block size."""
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"downsample takes a square (S, S) matrix, got shape {matrix.shape}")
    s = matrix.shape[-1]
    if s <= limit:
        return matrix, labels, 1
    block = -(-s // limit)
    n = -(-s // block)
    padded = np.full((n * block, n * block), np.nan, dtype=np.float32)
    padded[:s, :s] = matrix
    with warnings.catch_warnings():  # all-masked blocks are NaN on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        pooled = np.nanmean(padded.reshape(n, block, n, block), axis=(1, 3))
    names = [f"{i * block}–{min((i + 1) * block, s) - 1}" for i in range(n)]
    return pooled, names, block


def heatmap_height(labels: Sequence[str]) -> int:
    """The heatmap's height in px: ROW_PX a row, plus the title, the axis title and the room the
    key labels take below the plot (tilted 60°: a chat template's `13:<|end_header_id|>` takes
    ~110 px, which a fixed allowance left out, so a 15-token prompt got 13 px a row and plotly
    labelled every other query). Within 360–900 px: a long view is block-averaged anyway."""
    longest = max((len(html.unescape(label)) for label in labels), default=0)
    tilted = math.ceil(min(longest, LABEL_CHARS) * CHAR_PX * math.sin(math.radians(60)))
    return max(360, min(900, ROW_PX * len(labels) + HEATMAP_FRAME_PX + tilted))


def heatmap(matrix: np.ndarray, labels: list[str], title: str) -> go.Figure:
    """A query × key heatmap; masked (NaN) cells show the grey background, not a colour."""
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"heatmap takes a square (query, key) matrix, got shape {matrix.shape}")
    if len(labels) != matrix.shape[0]:
        raise ValueError(f"{len(labels)} labels for a {matrix.shape[0]}×{matrix.shape[1]} matrix")
    fig = go.Figure(go.Heatmap(
        z=matrix, x=labels, y=labels, colorscale="Viridis", zmin=0, zmax=float(np.nanmax(matrix))
        if np.isfinite(matrix).any() else 1, hoverongaps=False,
        colorbar={"title": {"text": _("weight")}},
        hovertemplate=_("query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>")))
    fig.update_layout(title=title, height=heatmap_height(labels), plot_bgcolor=MASKED_COLOR,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    fig.update_xaxes(title_text=_("key (attended-to token)"), showgrid=False, tickangle=-60)
    fig.update_yaxes(title_text=_("query (attending token)"), autorange="reversed", showgrid=False)
    return fig


def keys_per_head(heads: int, top: int = 24, max_rows: int = HEAD_VIEW_ROWS) -> int:
    """How many of its strongest keys the head view draws per head: at most `top`, and few enough
    that `heads` heads list at most `max_rows` key positions together."""
    return max(1, min(top, max_rows // max(heads, 1)))


def head_view_keys(weights: np.ndarray, heads: Sequence[int], query: int,
                   top: int = 24) -> tuple[list[int], dict[int, np.ndarray]]:
    """The key positions the head view lists (ascending) and, per head, the keys it draws."""
    per_head = keys_per_head(len(heads), top)
    drawn = {h: np.argsort(weights[h, query, : query + 1], kind="stable")[::-1][:per_head] for h in heads}
    keys = sorted({int(k) for ks in drawn.values() for k in ks})
    return keys, drawn


def head_name(head: int) -> str:
    """A head as the figures name it (a legend entry, an axis tick): 'head 3'."""
    return _("head {head}").format(head=head)


def head_view(weights: np.ndarray, labels: Sequence[str], heads: Sequence[int], query: int,
              top: int = 24) -> go.Figure:
    """Lines from one query token (left) to the keys it attends to (right), one colour per head.

    Width and opacity follow each weight relative to that head's strongest key, so a diffuse head
    (an early layer spreading ~1/S over every key) reads as clearly as a sharp one; the hover
    gives the weight itself. Only the drawn keys are listed, so the chart stays ≤ MAX_HEIGHT px.
    """
    n_heads, s = _check_weights(weights, labels)
    if not heads:
        raise ValueError("head_view needs at least one head")
    if bad := [h for h in heads if not 0 <= h < n_heads]:
        raise ValueError(f"heads {bad} out of range: this layer has {n_heads} heads")
    if not 0 <= query < s:
        raise ValueError(f"query {query} out of range: the sequence has {s} positions")
    keys, drawn = head_view_keys(weights, heads, query, top)
    row_of = {k: i for i, k in enumerate(keys)}
    mid = (len(keys) - 1) / 2
    fig = go.Figure()
    for i, h in enumerate(heads):
        row = weights[h, query, : query + 1]
        strongest = float(row.max()) or 1.0
        lane = 0.5 * (i - (len(heads) - 1) / 2) / len(heads)  # heads reaching one key stay apart
        for k in drawn[h]:
            w = float(row[k])
            rel = w / strongest
            fig.add_trace(go.Scatter(
                x=[0, 1], y=[mid, row_of[int(k)] + lane], mode="lines", showlegend=False,
                line={"color": HEAD_COLORS[h % len(HEAD_COLORS)], "width": 1.5 + 6.5 * rel},
                opacity=0.3 + 0.7 * rel, hoverinfo="text",
                text=_("head {head}: {query} → {key} · weight {weight}").format(
                    head=h, query=labels[query], key=labels[k], weight=f"{w:.3f}")))
    for h in heads:  # legend entries
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=head_name(h),
                                 line={"color": HEAD_COLORS[h % len(HEAD_COLORS)], "width": 4}))
    fig.add_trace(go.Scatter(x=[0], y=[mid], mode="text", text=[labels[query]],
                             textposition="middle left", showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[1] * len(keys), y=list(range(len(keys))), mode="text", showlegend=False,
                             text=[labels[k] for k in keys], textposition="middle right",
                             hoverinfo="skip"))
    fig.update_layout(height=min(MAX_HEIGHT, max(300, 18 * len(keys) + 100)),
                      margin={"l": 120, "r": 160, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": 1.05}, plot_bgcolor="white")
    fig.update_xaxes(visible=False, range=[-0.6, 1.6])
    fig.update_yaxes(visible=False, autorange="reversed")
    return fig


def model_view(prefill: np.ndarray, layers: Sequence[int], tile: int = 16) -> go.Figure:
    """All recorded layers (columns) × heads (rows) of the prefill attention (L, H, T, T) as one
    mosaic of ≤ tile × tile block means, square cells, a one-cell gap between tiles.

    A heatmap cannot be clicked into a selection (plotly selects points, not heatmap cells), so
    an invisible WebGL scatter lies over it, one point per cell: its hover says "layer L, head H,
    weight w" and a click on it selects a point whose customdata begins (layer, head) — read it
    back with `clicked_tile`. Masked cells get points too, so a click anywhere on a tile opens it.
    """
    if prefill.ndim != 4 or prefill.shape[2] != prefill.shape[3]:
        raise ValueError(f"prefill attention must be (layers, heads, T, T), got shape {prefill.shape}")
    n_layers, heads, t = prefill.shape[0], prefill.shape[1], prefill.shape[-1]
    if len(layers) != n_layers:
        raise ValueError(f"{len(layers)} layer numbers for {n_layers} recorded layers")
    size = min(tile, t)
    step = size + 1
    mosaic = np.full((heads * step, n_layers * step), np.nan, dtype=np.float32)
    owner = np.full(mosaic.shape + (2,), -1, dtype=np.int16)  # (layer, head) of each cell
    lower = np.tril(np.ones((t, t), dtype=bool))
    for li in range(n_layers):
        for h in range(heads):
            small, _names, _block = downsample(np.where(lower, prefill[li, h], np.nan), [], size)
            r, c = h * step, li * step
            mosaic[r:r + small.shape[0], c:c + small.shape[1]] = small
            owner[r:r + size, c:c + size] = (layers[li], h)
    top = float(np.nanpercentile(mosaic, 99)) if np.isfinite(mosaic).any() else 1.0
    fig = go.Figure(go.Heatmap(z=mosaic, colorscale="Viridis", zmin=0, zmax=top, hoverongaps=False,
                               colorbar={"title": {"text": _("weight")}}, hoverinfo="skip"))
    in_tile = owner[..., 0] >= 0
    for finite in (True, False):
        rows, cols = np.nonzero(in_tile & (np.isfinite(mosaic) == finite))
        if finite:
            data = np.column_stack([owner[rows, cols], mosaic[rows, cols]]).astype(np.float32)
            template = _("layer %{customdata[0]}, head %{customdata[1]}, weight "
                         "%{customdata[2]:.3f}<br>click to open<extra></extra>")
        else:
            data = owner[rows, cols]
            template = _("layer %{customdata[0]}, head %{customdata[1]}<br>masked: a future "
                         "token<br>click to open<extra></extra>")
        fig.add_trace(go.Scattergl(
            x=cols.astype(np.int16), y=rows.astype(np.int16), customdata=data, mode="markers",
            marker={"opacity": 0, "size": 4}, showlegend=False, hovertemplate=template))
    fig.update_layout(height=max(260, int(1000 * heads / max(n_layers, 1)) + 80), plot_bgcolor="white",
                      margin={"l": 10, "r": 10, "t": 30, "b": 10}, hoverdistance=-1,
                      hoverlabel={"bgcolor": "white"}, meta={"tile_cells": size})
    fig.update_xaxes(tickvals=[li * step + size / 2 for li in range(n_layers)],
                     ticktext=[f"L{layer}" for layer in layers], side="top",
                     showgrid=False, zeroline=False, title_text=_("layer"))
    fig.update_yaxes(tickvals=[h * step + size / 2 for h in range(heads)],
                     ticktext=[head_name(h) for h in range(heads)], autorange="reversed",
                     showgrid=False, zeroline=False, scaleanchor="x")
    return fig


def mark_tile(fig: go.Figure, layer: int, head: int) -> go.Figure:
    """A copy of a `model_view` figure with the tile of (layer, head) outlined, so the view shows
    which layer and head the other tabs open; `fig` is unchanged (it is built once per trace)."""
    xaxis, yaxis = fig.layout.xaxis, fig.layout.yaxis
    columns, rows = list(xaxis.ticktext or ()), list(yaxis.ticktext or ())
    if f"L{layer}" not in columns or head_name(head) not in rows:
        raise ValueError(f"the model view has no tile for layer {layer}, head {head}")
    half = fig.layout.meta["tile_cells"] / 2
    x = xaxis.tickvals[columns.index(f"L{layer}")]
    y = yaxis.tickvals[rows.index(head_name(head))]
    marked = go.Figure(fig)
    marked.add_shape(type="rect", xref="x", yref="y", x0=x - half - 0.5, x1=x + half - 0.5,
                     y0=y - half - 0.5, y1=y + half - 0.5, line={"color": MARK_COLOR, "width": 3},
                     fillcolor="rgba(0,0,0,0)", layer="above")
    return marked


def clicked_tile(points: Sequence[Mapping] | None) -> tuple[int, int] | None:
    """(layer, head) of the first clicked model-view point, or None when no point carries one.

    Streamlit passes plotly's point as it arrived: customdata is a list, or an object keyed
    "0", "1", … when the figure held it as a typed array."""
    for point in points or ():
        data = point.get("customdata") if isinstance(point, Mapping) else None
        if isinstance(data, Mapping):
            data = [data.get("0"), data.get("1")]
        try:
            return int(data[0]), int(data[1])
        except (TypeError, ValueError, IndexError, OverflowError):
            continue
    return None


def _check_decode(weights: np.ndarray, labels: Sequence[str], prompt_len: int) -> tuple[int, int, int]:
    """(heads, S, decode steps) of a layer's weights whose rows T … S − 1 are decode rows."""
    n_heads, s = _check_weights(weights, labels)
    if not 1 <= prompt_len < s:
        raise ValueError(f"prompt length {prompt_len} leaves no decode rows among {s} positions")
    return n_heads, s, s - prompt_len


def _decode_title(labels: Sequence[str], prompt_len: int, step: int, produced: str) -> str:
    position = prompt_len + step - 1  # of the token fed at this step
    return _("step {step}: token {token} attends over {cached} cached tokens, producing "
             "{produced}").format(step=step, token=labels[position], cached=position + 1,
                                  produced=as_text(repr(visible(piece_text(produced)))))


def decode_row_chart(weights: np.ndarray, labels: Sequence[str], prompt_len: int, step: int,
                     produced: str) -> go.Figure:
    """Decode step `step`: every head's attention over the whole cache (heads × key positions).

    The x axis holds all S positions in every step (keys not cached yet are grey), and the colour
    scale spans 0 … the largest weight of any decode row of this layer, so steps shown one after
    another differ only in their data.
    """
    n_heads, _positions, steps = _check_decode(weights, labels, prompt_len)
    if not 1 <= step <= steps:
        raise ValueError(f"decode step {step} out of range: this trace has steps 1–{steps}")
    decode_rows = weights[:, prompt_len:, :]
    zmax = float(np.nanmax(decode_rows)) if np.isfinite(decode_rows).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=weights[:, prompt_len + step - 1, :], x=list(labels), y=[head_name(h) for h in range(n_heads)],
        colorscale="Viridis", zmin=0, zmax=zmax, hoverongaps=False,
        colorbar={"title": {"text": _("weight")}},
        hovertemplate=_("%{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>")))
    fig.update_layout(height=min(MAX_HEIGHT, 120 + 26 * n_heads), margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      plot_bgcolor=MASKED_COLOR, title=_decode_title(labels, prompt_len, step, produced))
    fig.update_xaxes(title_text=_("cached key (prompt, then generated; grey: not cached yet)"),
                     tickangle=-60, showgrid=False)
    fig.update_yaxes(showgrid=False, autorange="reversed")
    return fig


def decode_frame_steps(steps: int, heads: int, positions: int, max_frames: int = MAX_FRAMES,
                       max_values: int = MAX_FRAME_VALUES) -> list[int]:
    """The decode steps the animation holds a frame for: all of them, or every n-th (and the last)
    when they are more than `max_frames` or their (heads × positions) rows more than `max_values`
    numbers in all — what the browser receives stays bounded whatever the trace."""
    stride = max(1, math.ceil(steps / max_frames), math.ceil(steps * heads * positions / max_values))
    shown = list(range(1, steps + 1, stride))
    return shown if shown[-1] == steps else [*shown, steps]


def decode_steps_chart(weights: np.ndarray, labels: Sequence[str], prompt_len: int,
                       produced: Sequence[str], frame_ms: int = 300) -> go.Figure:
    """Every decode step of one layer as one animated figure: frame k is `decode_row_chart`'s step
    k, and plotly's own slider and Play/Pause buttons run it in the browser. The slider moves with
    the frame shown, every frame keeps the first frame's colour scale and key axis, and the figure
    opens on step 1, drawn at once. `produced[k − 1]` is the piece decode step k produced.
    """
    n_heads, s, steps = _check_decode(weights, labels, prompt_len)
    if len(produced) != steps:
        raise ValueError(f"{len(produced)} produced pieces for {steps} decode steps")
    shown = decode_frame_steps(steps, n_heads, s)
    fig = decode_row_chart(weights, labels, prompt_len, shown[0], produced[0])
    zmin, zmax = fig.data[0].zmin, fig.data[0].zmax
    fig.frames = [go.Frame(
        name=str(k), data=[go.Heatmap(z=weights[:, prompt_len + k - 1, :], zmin=zmin, zmax=zmax)],
        layout={"title": {"text": f"<b>{_decode_title(labels, prompt_len, k, produced[k - 1])}</b>"}})
        for k in shown]  # bold, as Streamlit's theme draws the first title
    still = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}
    fig.update_layout(  # slider and buttons above the plot, clear of the rotated key labels
        height=min(MAX_HEIGHT, 260 + 26 * n_heads), margin={"l": 10, "r": 10, "t": 130, "b": 10},
        title={"y": 0.98, "yanchor": "top"},
        sliders=[{"active": 0, "currentvalue": {"prefix": _("decode step ")}, "x": 0.16, "len": 0.84,
                  "y": 1.0, "yanchor": "bottom", "pad": {"t": 0, "b": 10},
                  "steps": [{"label": str(k), "method": "animate", "args": [[str(k)], still]}
                            for k in shown]}],
        updatemenus=[{"type": "buttons", "direction": "left", "x": 0, "y": 1.0, "xanchor": "left",
                      "yanchor": "bottom", "pad": {"b": 25}, "showactive": False, "buttons": [
                          {"label": _("▶ Play"), "method": "animate", "args": [None, {
                              "mode": "immediate", "fromcurrent": True, "transition": {"duration": 0},
                              "frame": {"duration": frame_ms, "redraw": True}}]},
                          {"label": _("❚❚ Pause"), "method": "animate", "args": [[None], still]}]}])
    return fig
