"""Attention figures and per-head statistics, all pure functions of a Trace.

Attention arrays in a trace: prefill (L_rec, H, T, T); decode step k (L_rec, H, 1, T + k), the row
of the token fed at step k (position T + k − 1) over the whole cache. `full_attention` stitches
them into one (S, S) matrix per layer and head, S = T + decode steps.
"""

from __future__ import annotations

import warnings

import numpy as np
import plotly.graph_objects as go

from engine.trace import Trace

from .tokens import piece_text, visible

MASKED_COLOR = "#d9d9d9"  # cells a causal model cannot attend to (future tokens)
HEAD_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"]


def has_attention(trace: Trace) -> bool:
    return bool(trace.attention_layers) and bool(trace.steps) and trace.steps[0].attention is not None


def layer_slot(trace: Trace, layer: int) -> int:
    """Index of model layer `layer` in the recorded attention arrays."""
    return trace.attention_layers.index(layer)


def sequence_labels(trace: Trace) -> list[str]:
    """Labels of every position that has an attention row: the prompt, then fed-back outputs."""
    pieces = list(trace.prompt_pieces) + [s.piece for s in trace.steps[:-1]]
    return [f"{i}:{visible(piece_text(p))}" for i, p in enumerate(pieces)]


def full_attention(trace: Trace, layer: int) -> np.ndarray:
    """(H, S, S) float32: prefill rows, then each decode step's row; NaN where causally masked."""
    slot = layer_slot(trace, layer)
    prefill = trace.steps[0].attention[slot].astype(np.float32)  # (H, T, T)
    heads, t = prefill.shape[0], prefill.shape[1]
    s = t + len(trace.steps) - 1
    out = np.full((heads, s, s), np.nan, dtype=np.float32)
    lower = np.tril(np.ones((t, t), dtype=bool))
    out[:, :t, :t] = np.where(lower, prefill, np.nan)
    for k, step in enumerate(trace.steps[1:], start=1):
        row = step.attention[slot, :, 0, :].astype(np.float32)  # (H, T + k)
        out[:, t + k - 1, : t + k] = row
    return out


def downsample(matrix: np.ndarray, labels: list[str], limit: int) -> tuple[np.ndarray, list[str], int]:
    """Mean-pool a square (S, S) matrix into ≤ limit × limit blocks (NaN-aware); returns block size."""
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


def heatmap(matrix: np.ndarray, labels: list[str], title: str) -> go.Figure:
    """A query × key heatmap; masked (NaN) cells show the grey background, not a colour."""
    fig = go.Figure(go.Heatmap(
        z=matrix, x=labels, y=labels, colorscale="Viridis", zmin=0, zmax=float(np.nanmax(matrix))
        if np.isfinite(matrix).any() else 1, hoverongaps=False,
        colorbar={"title": {"text": "weight"}},
        hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>"))
    size = max(360, min(900, 16 * len(labels) + 160))
    fig.update_layout(title=title, height=size, plot_bgcolor=MASKED_COLOR,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    fig.update_xaxes(title_text="key (attended-to token)", showgrid=False, tickangle=-60)
    fig.update_yaxes(title_text="query (attending token)", autorange="reversed", showgrid=False)
    return fig


def head_view(trace: Trace, layer: int, heads: list[int], query: int, top: int = 24) -> go.Figure:
    """Lines from one query token (left) to the keys it attends to (right), one colour per head."""
    attn = full_attention(trace, layer)
    labels = sequence_labels(trace)
    keys = list(range(query + 1))
    fig = go.Figure()
    for h in heads:
        row = attn[h, query, : query + 1]
        for k in np.argsort(row)[::-1][:top]:
            w = float(row[k])
            fig.add_trace(go.Scatter(
                x=[0, 1], y=[query, k], mode="lines", showlegend=False,
                line={"color": HEAD_COLORS[h % len(HEAD_COLORS)], "width": 1 + 6 * w},
                opacity=max(0.05, min(1.0, w)), hoverinfo="text",
                text=f"head {h}: {labels[query]} → {labels[k]} · {w:.3f}"))
    for h in heads:  # legend entries
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"head {h}",
                                 line={"color": HEAD_COLORS[h % len(HEAD_COLORS)], "width": 4}))
    fig.add_trace(go.Scatter(x=[0], y=[query], mode="text", text=[labels[query]],
                             textposition="middle left", showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[1] * len(keys), y=keys, mode="text", showlegend=False,
                             text=[labels[k] for k in keys], textposition="middle right",
                             hoverinfo="skip"))
    fig.update_layout(height=max(360, 18 * len(keys) + 80), margin={"l": 120, "r": 160, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": 1.05}, plot_bgcolor="white")
    fig.update_xaxes(visible=False, range=[-0.6, 1.6])
    fig.update_yaxes(visible=False, autorange="reversed")
    return fig


def head_summary(trace: Trace) -> dict[str, np.ndarray]:
    """Per (layer, head) over the prefill matrix, averaged over query rows:
    entropy (nats), weight on the first token, on the previous token, on itself.
    Works one layer at a time so a long prompt never needs a float64 copy of every layer."""
    attention = trace.steps[0].attention  # (L, H, T, T) float16
    layers, heads, t = attention.shape[0], attention.shape[1], attention.shape[-1]
    out = {name: np.zeros((layers, heads)) for name in ("entropy", "first", "previous", "self")}
    idx = np.arange(t)
    for li in range(layers):
        a = attention[li].astype(np.float32)  # (H, T, T)
        plogp = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)
        out["entropy"][li] = -plogp.sum(-1, dtype=np.float64).mean(-1)
        out["first"][li] = a[:, :, 0].mean(-1, dtype=np.float64)
        out["self"][li] = a[:, idx, idx].mean(-1, dtype=np.float64)
        if t > 1:
            out["previous"][li] = a[:, idx[1:], idx[:-1]].mean(-1, dtype=np.float64)
    return out


def model_view(trace: Trace, tile: int = 16) -> tuple[go.Figure, int]:
    """All recorded layers (columns) × heads (rows) as one mosaic of downsampled prefill maps,
    square cells; returns the tile pitch (tile size + 1 gap) for mapping clicks back."""
    prefill = trace.steps[0].attention.astype(np.float32)  # (L, H, T, T)
    layers, heads, t = prefill.shape[0], prefill.shape[1], prefill.shape[-1]
    size = min(tile, t)
    step = size + 1
    mosaic = np.full((heads * step, layers * step), np.nan, dtype=np.float32)
    lower = np.tril(np.ones((t, t), dtype=bool))
    for li in range(layers):
        for h in range(heads):
            small, _, _ = downsample(np.where(lower, prefill[li, h], np.nan), [], size)
            r, c = h * step, li * step
            mosaic[r:r + small.shape[0], c:c + small.shape[1]] = small
    top = float(np.nanpercentile(mosaic, 99)) if np.isfinite(mosaic).any() else 1.0
    fig = go.Figure(go.Heatmap(z=mosaic, colorscale="Viridis", zmin=0, zmax=top, hoverongaps=False,
                               colorbar={"title": {"text": "weight"}},
                               hovertemplate="%{z:.3f}<extra></extra>"))
    fig.update_layout(height=max(260, int(1000 * heads / max(layers, 1)) + 80), plot_bgcolor="white",
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    fig.update_xaxes(tickvals=[li * step + size / 2 for li in range(layers)],
                     ticktext=[f"L{layer}" for layer in trace.attention_layers], side="top",
                     showgrid=False, title_text="layer")
    fig.update_yaxes(tickvals=[h * step + size / 2 for h in range(heads)],
                     ticktext=[f"head {h}" for h in range(heads)], autorange="reversed",
                     showgrid=False, scaleanchor="x")
    return fig, step


def decode_row_chart(trace: Trace, step_index: int, layer: int) -> go.Figure:
    """One decode step: every head's attention over the whole cache (heads × cached tokens)."""
    step = trace.steps[step_index]
    rows = step.attention[layer_slot(trace, layer), :, 0, :].astype(np.float32)  # (H, S)
    labels = sequence_labels(trace)[: rows.shape[1]]
    fig = go.Figure(go.Heatmap(
        z=rows, x=labels, y=[f"head {h}" for h in range(rows.shape[0])], colorscale="Viridis",
        zmin=0, colorbar={"title": {"text": "weight"}},
        hovertemplate="%{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>"))
    fed = labels[-1]
    fig.update_layout(height=120 + 26 * rows.shape[0], margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      title=f"step {step_index}: token {fed} attends over {rows.shape[1]} cached "
                            f"tokens, producing {visible(piece_text(step.piece))!r}")
    fig.update_xaxes(title_text="cached key (prompt, then generated)", tickangle=-60)
    return fig


def gqa_groups(heads: int, kv_heads: int) -> list[list[int]]:
    """Which query heads read each KV head (transformers' repeat_kv layout: h // (H / KVH))."""
    group = heads // kv_heads
    return [list(range(j * group, (j + 1) * group)) for j in range(kv_heads)]


def head_roles(summary: dict[str, np.ndarray], threshold: float = 0.5) -> np.ndarray:
    """A rough label per head from its summary: sink, previous-token, self, or mixed."""
    roles = np.full(summary["first"].shape, "mixed", dtype=object)
    roles[summary["self"] > threshold] = "self"
    roles[summary["previous"] > threshold] = "previous-token"
    roles[summary["first"] > threshold] = "sink (first token)"
    return roles
