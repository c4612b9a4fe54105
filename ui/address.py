"""The URL is the view: the selection (Attention's layer and head, Generate's token, Step by step's
stage) lives in the page's address next to the session token `s` (ui/record.py) and `present`
(ui/present.py), and the page is the address's path; so a reload, Back / Forward and a copied
address land on the same view.

Which side wins: on a session's first run (a new tab, a reload, a share link) and on a Back /
Forward, the address (a value it leaves out is the page's default); on every other run, the
session (its widgets, which the visitor just changed). `write_address()`, at the end of every run,
puts the session's selection in the address in one change, so each change of view is one entry
of the browser's history. The values are checked against the trace like a link's.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

from engine import Trace
from ui.config import config
from ui.link_params import LINK_PARAMS, SELECTION, VIEW, check_view, parse_link, view_defaults
from ui.state import app_state, current_trace


def history_navigation() -> bool:
    """Whether this run is the browser's Back / Forward (Streamlit reruns with that entry's
    address and says so in its run context: an internal API of the pinned Streamlit, which
    tests/e2e/test_links_browser.py's Back checks)."""
    return bool(getattr(get_script_run_ctx(), "is_history_navigation", False))


def address_params(names: tuple[str, ...]) -> dict[str, str]:
    return {name: st.query_params[name] for name in st.query_params if name in names}


def want_selection(view: dict[str, int], stage: int | None, whole: bool) -> None:
    """Show this selection. `whole` (Back / Forward: the address is the whole view): a value left
    out is the default; otherwise (a new session: a fresh tab, a reload, a link) a value left out
    is left as it is. The stage applies at once; layer, head and step once a trace holds them
    (`apply_pending_view`)."""
    if whole or stage is not None:
        app_state().page.story_at = (stage or 1) - 1
    names = VIEW if whole else view
    app_state().links.pending_view = {name: view.get(name) for name in names} or None


def follow_history() -> None:
    """On Back / Forward: the selection of the address the browser went back (or forward) to."""
    link, _ = parse_link(address_params(SELECTION), config().limits, ())
    want_selection(link.view, link.stage, whole=True)


def apply_pending_view() -> list[str]:
    """A link's or the address's layer/head/step, once a trace holds them (at once when the
    session has one; a prompt link's after it is generated). Returns a line for each value the
    trace lacks."""
    links, trace = app_state().links, current_trace()
    view = links.pending_view
    if view is None or trace is None or trace.stop_reason == "running":
        return []
    links.pending_view = None
    kept, notes = check_view({n: v for n, v in view.items() if v is not None}, trace)
    defaults = view_defaults(trace)
    chosen = {n: kept.get(n, defaults.get(n)) for n in view if n in kept or n in defaults}
    for name, value in chosen.items():
        st.session_state[VIEW[name]] = value
    note_view()
    return notes


def trace_id(trace: Trace | None) -> tuple[str, str] | None:
    return None if trace is None else (trace.created_at, trace.prompt)


def note_view() -> None:
    """Remember the layer, head and step selected on this trace (a page's widgets forget their
    value when another page is shown)."""
    trace, links = current_trace(), app_state().links
    seen = links.seen
    if seen is None or seen[0] != trace_id(trace):
        seen = links.seen = (trace_id(trace), {})
    for name, key in VIEW.items():
        if isinstance(st.session_state.get(key), int):
            seen[1][name] = st.session_state[key]


def keep_selection() -> None:
    """Give back to a page's widgets what they forgot while another page was shown."""
    seen = app_state().links.seen
    if seen is None or seen[0] != trace_id(current_trace()):
        return
    for name, value in seen[1].items():
        if VIEW[name] not in st.session_state:
            st.session_state[VIEW[name]] = value


def selection() -> dict[str, str]:
    """The session's selection as the address and a link carry it: the values that differ from
    the page's default and exist in the trace (a prompt link's, while its run is not there yet)."""
    links, trace = app_state().links, current_trace()
    params: dict[str, str] = {}
    if links.pending_view is not None:
        params = {n: str(v) for n, v in links.pending_view.items() if v is not None}
    elif trace is not None and links.seen is not None and links.seen[0] == trace_id(trace):
        defaults = view_defaults(trace)
        kept, _ = check_view(links.seen[1], trace)
        params = {n: str(v) for n, v in kept.items() if defaults.get(n) != v}
    stage = app_state().page.story_at + 1
    if stage != 1:
        params["stage"] = str(stage)
    return params


def write_address() -> None:
    """At the end of a run: the address holds the session's selection and no link parameter (a
    link is applied once), in one change."""
    note_view()
    current = st.query_params.to_dict()
    wanted = {k: v for k, v in current.items() if k not in LINK_PARAMS}
    wanted.update(selection())
    if wanted != current:
        st.query_params.from_dict(wanted)
