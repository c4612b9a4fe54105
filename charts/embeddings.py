"""Figures for the Tokens and Embeddings pages."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from i18n import N_, _

from .text import as_text

GROUP_STYLE = {"probed token": ("#111111", 15, "star"), "prompt token": ("#d62728", 11, "circle"),
               "neighbour": ("#1f77b4", 8, "circle"), "vocabulary sample": ("#c7c7c7", 4, "circle")}
# The groups' legend names (GROUP_STYLE's keys, translated where drawn).
GROUP_NAMES = {"probed token": N_("probed token"), "prompt token": N_("prompt token"),
               "neighbour": N_("neighbour"), "vocabulary sample": N_("vocabulary sample")}


def language_bars(names: list[str], tokens: list[int], ratios: list[float]) -> go.Figure:
    fig = go.Figure(go.Bar(x=names, y=tokens, customdata=ratios, marker_color="#1f77b4",
                           hovertemplate=_("%{x}<br>%{y} tokens<br>%{customdata:.2f}× English"
                                           "<extra></extra>")))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_yaxes(title_text=_("tokens for the same sentence"))
    fig.update_xaxes(title_text=_("language"))
    return fig


# Text labels on the PCA map: a 12 px font is about 7 px per character and 16 px tall, drawn
# above its marker; the map's plot area is at least PLOT_PX (the page's narrowest layout), so
# boxes sized in those pixels and converted through the axis ranges never overlap on screen.
CHAR_PX, LINE_PX, LIFT_PX, MARKER_PX, PLOT_PX = 7.0, 16.0, 6.0, 6.0, (640.0, 420.0)
MAP_HEIGHT = 520
LABELLED = ("probed token", "neighbour", "prompt token")  # labelling priority


POSITIONS = ("top center", "bottom center", "middle right", "middle left")  # tried in order


def label_box(x: float, y: float, text: str, position: str) -> tuple[float, float, float, float]:
    """(left, right, bottom, top) in px of `text` drawn at `position` of a marker at (x, y) px."""
    width = len(text) * CHAR_PX + 6
    if position == "top center":
        return x - width / 2, x + width / 2, y + LIFT_PX, y + LIFT_PX + LINE_PX
    if position == "bottom center":
        return x - width / 2, x + width / 2, y - LIFT_PX - LINE_PX, y - LIFT_PX
    if position == "middle right":
        return x + LIFT_PX, x + LIFT_PX + width, y - LINE_PX / 2, y + LINE_PX / 2
    return x - LIFT_PX - width, x - LIFT_PX, y - LINE_PX / 2, y + LINE_PX / 2


def label_positions(coords: np.ndarray, labels: list[str], x_range: tuple[float, float],
                    y_range: tuple[float, float], plot_px: tuple[float, float] = PLOT_PX
                    ) -> list[str | None]:
    """Where each point's text label goes (a plotly textposition), or None for no label. In
    order (earlier points first), a point at least LINE_PX from every labelled one takes the
    first of POSITIONS whose box keeps clear of every box already placed and of every other
    point's marker; a point with no such place shows its label on hover only. Why: the prompt
    and the neighbours crowd the centre of the map, where labelling every point draws one
    unreadable blot."""
    sx = plot_px[0] / (x_range[1] - x_range[0])  # px per data unit
    sy = plot_px[1] / (y_range[1] - y_range[0])
    xy = np.asarray(coords, dtype=float).reshape(-1, 2) * [sx, sy]  # (n, 2) px
    boxes: list[tuple[float, float, float, float]] = []
    anchors: list[np.ndarray] = []  # labelled points, px
    out: list[str | None] = []
    for i, text in enumerate(labels):
        others = np.delete(xy, i, axis=0)
        out.append(None)
        if any(np.hypot(*(xy[i] - a)) < LINE_PX for a in anchors):
            continue  # a labelled point this close would leave it unclear which label is whose
        for position in POSITIONS:
            box = label_box(xy[i, 0], xy[i, 1], text, position)
            clear = all(box[1] <= b[0] or b[1] <= box[0] or box[3] <= b[2] or b[3] <= box[2]
                        for b in boxes)
            covered = ((others[:, 0] > box[0] - MARKER_PX) & (others[:, 0] < box[1] + MARKER_PX)
                       & (others[:, 1] > box[2] - MARKER_PX) & (others[:, 1] < box[3] + MARKER_PX))
            if clear and not covered.any():
                boxes.append(box)
                anchors.append(xy[i])
                out[i] = position
                break
    return out


def _padded(values: np.ndarray, pad: float = 0.06) -> tuple[float, float]:
    lo, hi = float(values.min()), float(values.max())
    span = (hi - lo) or 1.0
    return lo - pad * span, hi + pad * span


def embedding_map(points: dict[str, tuple[np.ndarray, list[str]]],
                  hover: dict[str, list[str]] | None = None) -> go.Figure:
    """PCA scatter; `points` maps a group name (GROUP_STYLE) to (coords (n, 2), labels); `hover`
    optionally gives a group longer hover texts. The probed token is labelled first, then its
    neighbours, then the prompt's tokens, each only where its text has room (`label_positions`);
    every point shows its label on hover. Axis ranges are set (the data's extent, padded) so
    the room computed here is the room on screen. Hover texts are escaped (a vocabulary piece
    such as `<br>` is shown, not obeyed: charts/text.py); WebGL's point labels draw text as it
    is, references included, so they stay unescaped."""
    everything = np.vstack([np.asarray(c).reshape(-1, 2) for c, _labels in points.values()])  # (N, 2)
    x_range, y_range = _padded(everything[:, 0]), _padded(everything[:, 1])
    order = [g for g in LABELLED if g in points]
    texts = [t for g in order for t in points[g][1]]
    coords = np.vstack([np.asarray(points[g][0]).reshape(-1, 2) for g in order]) if order \
        else np.zeros((0, 2))
    where = label_positions(coords, texts, x_range, y_range)
    placed, at = {}, 0
    for g in order:
        placed[g], at = where[at:at + len(points[g][1])], at + len(points[g][1])
    fig = go.Figure()
    for group in ("vocabulary sample", *reversed(LABELLED)):  # the probed token drawn on top
        if group not in points:
            continue
        xy, labels = np.asarray(points[group][0]).reshape(-1, 2), points[group][1]
        color, size, symbol = GROUP_STYLE[group]
        text = [t if p else "" for t, p in zip(labels, placed[group])] if group in placed else None
        fig.add_trace(go.Scattergl(
            x=xy[:, 0], y=xy[:, 1], mode="markers+text" if text is not None else "markers",
            text=text, textposition=[p or "top center" for p in placed[group]]
            if group in placed else None, textfont={"size": 12, "color": color},
            hovertext=[as_text(h) for h in (hover or {}).get(group, labels)], hoverinfo="text",
            name=_(GROUP_NAMES.get(group, group)),
            marker={"color": color, "size": size, "symbol": symbol}))
    fig.update_layout(height=MAP_HEIGHT, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.05})
    fig.update_xaxes(title_text=_("principal component 1 (embedding units)"), range=x_range)
    fig.update_yaxes(title_text=_("principal component 2 (embedding units)"), range=y_range)
    return fig


def rope_angle_chart(angle_table: np.ndarray, positions: np.ndarray) -> go.Figure:
    """Angle (mod 2π) of every dimension pair at each position."""
    fig = go.Figure(go.Heatmap(
        z=np.mod(angle_table, 2 * np.pi).T, x=positions, colorscale="Twilight", zmin=0,
        zmax=2 * np.pi, colorbar={"title": {"text": _("angle (rad)")}},
        hovertemplate=_("position %{x}<br>pair %{y}<br>angle %{z:.2f} rad<extra></extra>")))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10})
    fig.update_xaxes(title_text=_("position"))
    fig.update_yaxes(title_text=_("dimension pair (0 = fastest rotation)"))
    return fig


def rope_score_chart(distances: np.ndarray, series: dict[str, np.ndarray]) -> go.Figure:
    fig = go.Figure()
    for name, scores in series.items():
        fig.add_trace(go.Scatter(x=distances, y=scores, mode="lines", name=name,
                                 hovertemplate=_("distance %{x}<br>q·k %{y:.3f}<extra></extra>")))
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 20, "b": 10},
                      legend={"orientation": "h", "y": 1.1})
    fig.update_xaxes(title_text=_("relative distance between query and key (tokens)"))
    fig.update_yaxes(title_text=_("q·k after rotation"))
    return fig
