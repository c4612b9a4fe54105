"""Figures for the Tokens and Embeddings pages."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

GROUP_STYLE = {"prompt token": ("#d62728", 11), "neighbour": ("#1f77b4", 8),
               "vocabulary sample": ("#c7c7c7", 4)}


def language_bars(names: list[str], tokens: list[int], ratios: list[float]) -> go.Figure:
    fig = go.Figure(go.Bar(x=names, y=tokens, customdata=ratios, marker_color="#1f77b4",
                           hovertemplate="%{x}<br>%{y} tokens<br>%{customdata:.2f}× English"
                                         "<extra></extra>"))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_yaxes(title_text="tokens for the same sentence")
    fig.update_xaxes(title_text="language")
    return fig


def embedding_map(points: dict[str, tuple[np.ndarray, list[str]]]) -> go.Figure:
    """PCA scatter; `points` maps a group name to (coords (n, 2), hover labels)."""
    fig = go.Figure()
    for group in ("vocabulary sample", "neighbour", "prompt token"):
        if group not in points:
            continue
        coords, labels = points[group]
        color, size = GROUP_STYLE[group]
        fig.add_trace(go.Scattergl(
            x=coords[:, 0], y=coords[:, 1], mode="markers+text" if group != "vocabulary sample"
            else "markers", text=labels if group != "vocabulary sample" else None,
            textposition="top center", hovertext=labels, hoverinfo="text", name=group,
            marker={"color": color, "size": size}))
    fig.update_layout(height=520, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.05})
    fig.update_xaxes(title_text="principal component 1")
    fig.update_yaxes(title_text="principal component 2")
    return fig


def rope_angle_chart(angle_table: np.ndarray, positions: np.ndarray) -> go.Figure:
    """Angle (mod 2π) of every dimension pair at each position."""
    fig = go.Figure(go.Heatmap(
        z=np.mod(angle_table, 2 * np.pi).T, x=positions, colorscale="Twilight", zmin=0,
        zmax=2 * np.pi, colorbar={"title": {"text": "angle (rad)"}},
        hovertemplate="position %{x}<br>pair %{y}<br>angle %{z:.2f} rad<extra></extra>"))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_xaxes(title_text="position")
    fig.update_yaxes(title_text="dimension pair (0 = fastest rotation)")
    return fig


def rope_score_chart(distances: np.ndarray, series: dict[str, np.ndarray]) -> go.Figure:
    fig = go.Figure()
    for name, scores in series.items():
        fig.add_trace(go.Scatter(x=distances, y=scores, mode="lines", name=name,
                                 hovertemplate="distance %{x}<br>q·k %{y:.3f}<extra></extra>"))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.1})
    fig.update_xaxes(title_text="relative distance between query and key (tokens)")
    fig.update_yaxes(title_text="q·k after rotation")
    return fig
