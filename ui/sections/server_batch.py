"""The Serving page's live view of this server's own batch (ui/batching.py): how many visitors'
runs decode together right now, how long each is, and the recent steps — counts and lengths
only, never another visitor's text. Shown where batching is on (the hosted demo)."""

from __future__ import annotations

import statistics
import time

import streamlit as st

from charts.server_batch import live_batch_chart
from i18n import _
from ui.common import show_chart
from ui.config import config
from ui.state import session_model

REFRESH_S = 2.0


def server_batch_section() -> None:
    if not config().batching:
        return
    st.subheader(_("This server's own batch, live"))
    st.caption(_("Visitors' Generate runs on this server decode the way this page's stream does: "
                 "every run that is decoding shares one forward per step. Counts and lengths "
                 "only — nobody's text. Refreshed every {s:.0f} s.").format(s=REFRESH_S))
    _live()


def batch_over_time(recent: list[tuple[float, int, float]]) -> float:
    """The runs per forward of (time, batch, forward ms) steps, weighted by forward time."""
    total = sum(ms for _t, _b, ms in recent)
    if total <= 0:
        return statistics.mean(b for _t, b, _ms in recent)
    return sum(b * ms for _t, b, ms in recent) / total


@st.fragment(run_every=REFRESH_S)
def _live() -> None:
    model = session_model()
    batcher = None if model is None else model.entry.extras.get("batcher")
    view = None if batcher is None or isinstance(batcher, Exception) else batcher.snapshot()
    if view is None or view.steps == 0:
        st.info(_("No visitor's run has decoded in this server's batch yet: press Generate "
                  "(with the KV cache on) and come back, or ask a class to."))
        return
    now = time.monotonic()
    recent = [r for r in view.recent if now - r[0] <= 60]
    cols = st.columns(4)
    cols[0].metric(_("Runs decoding now"), f"{view.running}",
                   help=_("Admitted to the batch (at most {n}).").format(n=view.max_batch))
    cols[1].metric(_("Waiting to join"), f"{view.waiting}")
    cols[2].metric(_("Their lengths (tokens)"),
                   "—" if not view.lengths else f"{view.lengths[0]}"
                   if min(view.lengths) == max(view.lengths)
                   else f"{min(view.lengths)}–{max(view.lengths)}",
                   help=_("Prompt and tokens so far of each decoding run."))
    cols[3].metric(_("Runs per step, last minute"),
                   f"{batch_over_time(recent):.1f}" if recent else "—",
                   help=_("How many runs a forward served, averaged over the last 60 s with "
                          "each step weighted by its forward's time, as the chart's bars are "
                          "wide: a run decoding alone for many quick steps does not outweigh a "
                          "class decoding together."))
    if recent:
        show_chart(live_batch_chart(recent, now), key="server-batch", name="server_batch")
