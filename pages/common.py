"""Page parts shared by several pages (not a page itself: app.py lists the pages)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, TypeVar

import streamlit as st

from engine import Trace
from pages.state import LOCK, current_trace

T = TypeVar("T")


def no_trace_notice(then: str = "") -> None:
    """Say how to get a trace, instead of an empty screen."""
    st.info("No trace yet. Generate one, or upload a trace file to replay, on the Generate page."
            + (f" {then}" if then else ""))
    st.page_link("pages/generate.py", label="Go to Generate", icon=":material/play_arrow:")


def require_trace() -> Trace:
    """The session's trace; without one, the notice and the end of this page's run."""
    trace = current_trace()
    if trace is None:
        no_trace_notice()
        st.stop()
    return trace


@contextlib.contextmanager
def model_turn() -> Iterator[None]:
    """Hold the process-wide lock while this session runs the shared model (a generation, a
    sweep, a cache experiment, a compile, a ceiling measurement): one run at a time, so no
    visitor's timings are measured while another visitor's forward shares the cores. Waiting
    visitors are served first come, first served, and see their place in the queue."""
    notice = st.empty()

    def waiting(place: int, held_s: float) -> None:
        ahead = ("another visitor's run is using the model; yours is next in the queue" if place == 1
                 else f"{place} runs are ahead of yours in the queue")
        notice.info(f"Busy: {ahead} (the current run has taken {held_s:.0f} s so far). Yours "
                    "starts by itself: keep this page open.", icon=":material/hourglass:")

    try:
        with LOCK.turn(on_wait=waiting):
            notice.empty()
            yield
    finally:
        notice.empty()


def memo(name: str, key: tuple, compute: Callable[[], T]) -> T:
    """`compute()` once per session for each new `key` (the last one is kept under `name`), so
    a page's reruns do not redo heavy work. A Trace in the key compares by identity."""
    held = st.session_state.get(name)
    if held is None or held[0] != key:
        held = st.session_state[name] = (key, compute())
    return held[1]
