"""Page parts shared by several pages (not a page itself: app.py lists the pages)."""

from __future__ import annotations

import streamlit as st

from engine import Trace


def no_trace_notice(then: str = "") -> None:
    """Say how to get a trace, instead of an empty screen."""
    st.info("No trace yet. Generate one, or upload a trace file to replay, on the Generate page."
            + (f" {then}" if then else ""))
    st.page_link("pages/generate.py", label="Go to Generate", icon=":material/play_arrow:")


def require_trace() -> Trace:
    """The session's trace; without one, the notice and the end of this page's run."""
    trace = st.session_state.get("trace")
    if trace is None:
        no_trace_notice()
        st.stop()
    return trace
