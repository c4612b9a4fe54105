"""Layout fixes every chart gets on screen (ui/common.py `show_chart`), whatever the page.

A horizontal legend placed above the plot (`y` > 1) is anchored by its top by default: on a
narrow screen (a phone) its entries wrap onto more rows, which grow downwards over the plot.
Anchored by its bottom, the rows grow upwards into the top margin, which plotly enlarges for
them."""

from __future__ import annotations

import plotly.graph_objects as go

LEGEND_GAP = 0.02  # of the plot's height, between the legend's last row and the plot


def legend_above(fig: go.Figure) -> go.Figure:
    """`fig` with a top legend anchored by its bottom, as a copy (pages keep their figures in
    memos); `fig` itself when there is nothing to change."""
    legend = fig.layout.legend
    if legend.orientation != "h" or legend.y is None or legend.y <= 1 or legend.yanchor not in (None, "auto"):
        return fig
    out = go.Figure(fig)
    out.layout.legend.update(y=1 + LEGEND_GAP, yanchor="bottom")
    return out
