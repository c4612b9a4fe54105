"""The hosted server's own batch, live (ui/sections/server_batch.py): its recent batched steps
as bars, from engine/serving/batcher.py's snapshot — counts and times, never a visitor's text."""

from __future__ import annotations

import plotly.graph_objects as go

from i18n import _

from .serving import BATCH_COLOR


def live_batch_chart(recent: list[tuple[float, int, float]], now: float) -> go.Figure:
    """The hosted server's recent batched steps (engine/serving/batcher.py's snapshot): one bar
    per step at its time (seconds before `now`), its height the runs that shared its forward,
    the forward's time on hover."""
    fig = go.Figure(go.Bar(
        x=[t - now for t, __, __ in recent], y=[b for __, b, __ in recent],
        marker_color=BATCH_COLOR, width=[max(ms / 1000, 0.05) for __, __, ms in recent],
        hovertemplate=[_("{ago:.1f} s ago: {n} runs in one forward of {ms:.0f} ms").format(
            ago=now - t, n=b, ms=ms) + "<extra></extra>" for t, b, ms in recent],
        name=_("runs in the step")))
    fig.update_layout(height=260, margin={"l": 60, "r": 20, "t": 40, "b": 50},
                      title=_("This server's batched steps, the last minute"), showlegend=False,
                      xaxis={"title": _("seconds before now"), "range": [-60, 0]},
                      yaxis={"title": _("runs in the step"), "rangemode": "tozero",
                             "tickformat": "d",  # whole runs: never 0.5 or 1.5
                             "dtick": next(d for d in (1, 2, 5, 10, 20, 50, 10**9)
                                           if max((b for __, b, __ in recent), default=1) / d
                                           <= 8)})
    return fig
