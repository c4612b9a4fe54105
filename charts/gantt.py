"""The one Gantt layout for many requests over time (the Serving page's stream, the Serving
engine page's load): one row per request, a bar per phase, marks where requests arrived or
ended, the legend above the plot. Pure plotly: each page's chart says what its phases are."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

from i18n import _


def top_legend(fig: go.Figure, entries: int, per_row: int = 6) -> None:
    """The title at the very top, the legend in rows under it, above the plot (not over the
    title, nor under the toolbar at the right)."""
    rows = max(1, -(-entries // per_row))
    fig.update_layout(title={"y": 1.0, "yref": "container", "yanchor": "top", "pad": {"t": 10},
                             "x": 0, "xref": "paper"},
                      legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0,
                              "xanchor": "left"},
                      margin={"t": 44 + 24 * rows})


@dataclass(slots=True)
class Bars:
    """One phase's bars (one legend entry): where each starts, how long it lasts, its row and its
    hover text, in the chart's time unit."""

    name: str
    color: str
    base: list[float] = field(default_factory=list)
    length: list[float] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    hover: list[str] = field(default_factory=list)

    def add(self, base: float, length: float, row: str, hover: str) -> None:
        self.base.append(base)
        self.length.append(length)
        self.rows.append(row)
        self.hover.append(hover)


@dataclass(frozen=True, slots=True)
class Marks:
    """Markers on the rows (arrivals, ends): their times, rows, hover texts and marker style;
    `showlegend` None: plotly's default."""

    name: str
    x: Sequence[float | None]
    rows: Sequence[str | None]
    hover: Sequence[str]
    marker: dict[str, Any]
    showlegend: bool | None = None


def gantt_figure(rows: list[str], bars: Sequence[Bars], marks: Sequence[Marks], *, title: str,
                 height: int, legend_entries: int, time_axis: str) -> go.Figure:
    """The requests' rows top to bottom, each phase's bars overlaid, then the marks. An empty
    phase keeps its legend entry (plotly leaves an empty trace out of the legend)."""
    fig = go.Figure()
    for b in bars:
        fig.add_trace(go.Bar(x=b.length or [None], base=b.base or [None], y=b.rows or [None],
                             orientation="h", name=b.name, marker_color=b.color,
                             hovertext=b.hover, hoverinfo="text"))
    for m in marks:
        shown = {} if m.showlegend is None else {"showlegend": m.showlegend}
        fig.add_trace(go.Scatter(x=m.x, y=m.rows, mode="markers", name=m.name, marker=m.marker,
                                 hovertext=m.hover, hoverinfo="text", **shown))
    fig.update_layout(height=height, barmode="overlay", bargap=0.3,
                      margin={"l": 10, "r": 10, "b": 10}, hovermode="closest", title_text=title)
    top_legend(fig, legend_entries)
    fig.update_xaxes(title_text=time_axis, rangemode="tozero")
    fig.update_yaxes(title_text=_("request"), categoryorder="array", categoryarray=rows,
                     autorange="reversed")
    return fig
