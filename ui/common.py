"""Page parts shared by several pages (not a page itself: app.py lists the pages)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, TypeVar

import plotly.graph_objects as go
import streamlit as st

from charts.present import presentation
from engine import Trace
from engine.timing.disturbance import RULE, assess
from pages.present import PAGE_TITLE, chart_config, chart_format, figure_title, presenting
from pages.state import LOCK, config, current_trace

T = TypeVar("T")


def no_trace_notice(then: str = "") -> None:
    """Say how to get a trace, instead of an empty screen."""
    st.info("No trace yet. Generate one, open an example run (no model needed) or upload a trace "
            "file, on the Generate page."
            + (f" {then}" if then else ""))
    st.page_link("pages/generate.py", label="Go to Generate", icon=":material/play_arrow:")


def require_trace() -> Trace:
    """The session's trace; without one, the notice and the end of this page's run."""
    trace = current_trace()
    if trace is None:
        no_trace_notice()
        st.stop()
    return trace


BUDGET_NOTE = ("Stopped at this demo's limit of {s:.0f} s of model time per click, so that no "
               "visitor waits long for another; what was measured is shown.")


@contextlib.contextmanager
def model_turn(stop: threading.Event | None = None) -> Iterator[threading.Event]:
    """Hold the process-wide turn while this session runs the shared model (a generation, a
    sweep, a cache experiment, a compile, a ceiling measurement): one run at a time, so no
    visitor's timings are measured while another visitor's forward shares the cores. Waiting
    visitors are served first come, first served, and see their place in the queue and an
    estimate. Yields `stop` (or a new event), which is set once this turn has used the hosted
    per-click budget (`Limits.click_s`): loops check it and end early (see BUDGET_NOTE)."""
    stop = stop or threading.Event()
    notice = st.empty()

    def waiting(place: int, held_s: float) -> None:
        typical = LOCK.typical_hold_s
        ahead = ("another visitor's run is using the model; yours is next in the queue" if place == 1
                 else f"{place} runs are ahead of yours in the queue")
        estimate = ("" if typical is None else
                    f" Runs here take about {typical:.0f} s: yours should start in about "
                    f"{max(typical - held_s, 1) + (place - 1) * typical:.0f} s.")
        notice.info(f"Busy: {ahead} (the current run has taken {held_s:.0f} s so far).{estimate} "
                    "Yours starts by itself: keep this page open.", icon=":material/hourglass:")

    budget = config().limits.click_s
    try:
        with LOCK.turn(on_wait=waiting):
            notice.empty()
            timer = threading.Timer(budget, stop.set) if budget else None
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                yield stop
            finally:
                if timer is not None:
                    timer.cancel()
    finally:
        notice.empty()


def memo(name: str, key: tuple, compute: Callable[[], T]) -> T:
    """`compute()` once per session for each new `key` (the last one is kept under `name`), so
    a page's reruns do not redo heavy work. A Trace in the key compares by identity."""
    held = st.session_state.get(name)
    if held is None or held[0] != key:
        held = st.session_state[name] = (key, compute())
    return held[1]


def disturbance_warning(trace: Trace) -> None:
    """A plain warning when other work on the machine delayed this run's steps, with the rule."""
    result = assess(trace)
    warning = result.warning()
    if warning is None:
        return
    st.warning(warning, icon=":material/speed:")
    with st.expander("How a step is marked delayed"):
        st.markdown(RULE)


def show_chart(figure: go.Figure, *, where: Any = None, name: str = "",
               config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Draw a plotly chart; every page's charts go through here. In presentation mode the figure
    is drawn restyled for a projector (charts/present.py; the caller's figure is unchanged), and
    the toolbar's camera downloads the session's chosen format (png or svg) under a file name
    from the page and `name` (default: the chart's title, else its key). `where`: a placeholder
    or container to draw into (default: here). Other arguments go to `st.plotly_chart`."""
    kwargs.setdefault("width", "stretch")
    label = name or figure_title(figure) or str(kwargs.get("key") or "")
    shown = presentation(figure) if presenting() else figure
    target = st if where is None else where
    return target.plotly_chart(shown, config=chart_config(
        chart_format(), st.session_state.get(PAGE_TITLE, ""), label, config), **kwargs)


def bytes_once(key: str, record: Any, to_bytes: Callable[[Any], bytes]) -> bytes:
    """A record's file bytes for a download button, made once per record and kept under `key`
    (bytes, not a callable: see pages/generate.py)."""
    memo = st.session_state.get(key)
    if memo is None or memo[0] is not record:
        memo = st.session_state[key] = (record, to_bytes(record))
    return memo[1]


def opened_file(label: str, key: str, max_mb: int, load: Callable[[bytes], T]) -> tuple[T, str] | None:
    """A record file the visitor has just uploaded, read by `load` (never unpickled), with its
    name; None when there is none, it was opened already, or it was refused — then with one
    sentence on the page."""
    from engine.errors import EngineError, InputError
    from pages.state import message

    upload = st.file_uploader(label, type=["json"], key=key, max_upload_size=max_mb)
    if upload is None or st.session_state.get(f"{key}_opened") == upload.file_id:
        return None
    st.session_state[f"{key}_opened"] = upload.file_id
    try:
        if upload.size > max_mb << 20:
            raise InputError(f"the file is over {max_mb} MB")
        return load(upload.getvalue()), upload.name[:120]
    except EngineError as err:
        st.error(f"Not opened: {message(err)}")
        return None
