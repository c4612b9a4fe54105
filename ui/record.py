"""What a reload restores: each session's record (its trace, prompt, experiment results, compare
runs, serving results), kept server-side under a token the page's URL carries (?s=…).

A reload (or a dropped websocket) starts a new Streamlit session with empty state; the new session
gets a copy of the record (ui/sessions.py) under a token of its own. Every change to a kept value
goes through a `keep_*` function here, which updates the session's AppState (ui/state.py) and the
record together. Four kept values are widget values (the prompt box, Compare's run-A selector,
the model box and the weights): they live under their widget keys, and a restored model is
checked again as a typed one is (the sidebar's refusal rules apply to it). What is selected
(layer, head, step, stage) is not in the record: the address holds it, next to `s`, and a
reload applies it (ui/address.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import streamlit as st

from engine import Trace
from engine.experiments import Experiments
from i18n import _
from ui import keys, shared
from ui.clients import current_client
from ui.results import RemoteResults, WhatIfResults
from ui.sessions import new_token
from ui.state import AppState, app_state, serving_results

_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{8,32}")
Put = Callable[[AppState, Any], None]  # sets one kept item in a session


def _set_widget(key: str) -> Put:
    def put(state: AppState, value: Any) -> None:
        if st.session_state.get(key) != value:  # a widget's own key holds it already
            st.session_state[key] = value
    return put


def _set(concern: str | None, name: str) -> Put:
    def put(state: AppState, value: Any) -> None:
        setattr(state if concern is None else getattr(state, concern), name, value)
    return put


# Each kept item (its name in the record) and where it lives in the session.
KEPT: dict[str, Put] = {
    "trace": _set("run", "trace"),
    "prompt": _set_widget(keys.PROMPT),
    "experiments": _set(None, "experiments"),
    "compare_b": _set("compare", "b"),
    "compare_b_label": _set("compare", "label"),
    "compare_a": _set_widget(keys.COMPARE_A),
    "opened_example": _set("run", "example"),
    "serving": _set(None, "serving"),
    "serving_engine": _set(None, "remote"),
    "whatif": _set(None, "whatif"),
    "model_source": _set_widget(keys.MODEL_SOURCE),
    "weights": _set_widget(keys.WEIGHTS),
}


def restore_session() -> None:
    """Give this session its token (kept in the URL as ?s=…); a new session that arrives with a
    known token (a reload, a reconnect) gets a copy of that record under a token of its own."""
    state = app_state()
    token = state.token
    if token is None:
        token = new_token()
        came_with = st.query_params.get("s", "")
        record = shared.SESSIONS.copy(came_with) if _TOKEN_SHAPE.fullmatch(came_with) else None
        for item, value in (record or {}).items():
            if item == "trace" and value.stop_reason == "running":  # the reload cut its run short
                value = replace(value, stop_reason="stopped")
            if item in KEPT:
                KEPT[item](state, value)
                _stored(state, token, item, value)
        state.token = token
    if st.query_params.get("s") != token:
        st.query_params["s"] = token


def _keep(item: str, value: Any) -> None:
    """Set a kept value in this session and in its record."""
    state = app_state()
    KEPT[item](state, value)
    if state.token is not None:
        _stored(state, state.token, item, value)


def _stored(state: AppState, token: str, item: str, value: Any) -> None:
    """Write one item of the session's record; remember which items the store refused (full of
    other visitors' recent work, or over this visitor's share), for the page's notice."""
    if shared.SESSIONS.put(token, item, value, current_client()):
        state.not_kept.discard(item)
    else:
        state.not_kept.add(item)


def not_kept_notice() -> str | None:
    """One line while some of this session's work is not kept on the server, else None."""
    if not app_state().not_kept:
        return None
    return _("This server is busy: your latest work here is not kept on it, so a reload or a "
             "lost connection would lose it (it stays in this tab; download a trace to keep it).")


def keep_model_choice(source: str | None, weights: str) -> None:
    """The model box (None: a hosted server, which has none) and the weights, written when they
    change, so a reload opens the model this session chose."""
    kept = st.session_state.setdefault(keys.KEPT_MODEL, {})
    for item, value in (("model_source", source), ("weights", weights)):
        if value is not None and kept.get(item) != value:
            kept[item] = value
            _keep(item, value)


# Widgets drawn on one page whose value outlives it: Streamlit drops a widget's value at the end of
# a run that did not draw it (any other page), unless the value is written back on every run.
HELD_WIDGETS = (keys.PROMPT,)


def hold_page_widgets() -> None:
    """Write each held widget's value back, so a page change does not empty it (the Prompt box,
    coming back to Generate). Call on every run, before the page draws."""
    for key in HELD_WIDGETS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def keep_prompt(prompt: str) -> None:
    _keep("prompt", prompt)


def keep_trace(trace: Trace) -> None:
    _keep("trace", trace)


def keep_new_trace(trace: Trace, experiments: Experiments | None = None) -> None:
    """A new trace: results computed on the old one (cache variants, kernel comparison) go, the
    machine's own measurements (sweeps, cache on vs off) stay; a file's own results replace all."""
    app_state().run.pending = None
    keep_trace(trace)
    if experiments is None:
        experiments = replace(app_state().experiments, cache_variants=(), cache_shrink=(),
                              decode_comparison=None, dtype_comparison=None)
    _keep("experiments", experiments)


def keep_experiments(**changes: Any) -> None:
    _keep("experiments", replace(app_state().experiments, **changes))


def keep_example(name: str, trace: Trace) -> None:
    """The session's trace is the shipped example `name`."""
    _keep("opened_example", (name, trace.created_at))


def keep_compare_run(label: str, trace: Trace) -> None:
    _keep("compare_b_label", label)
    _keep("compare_b", trace)


def keep_compare_a(choice: str) -> None:
    """The run-A selector's choice, kept for a reload (its widget has set it in this session)."""
    _keep("compare_a", choice)


def keep_serving(others: tuple[str, float | None] | None = None, **changes: Any) -> None:
    """Replace some of the Serving page's results (and, with `others`, that run's CPU share)."""
    found = serving_results()
    if "run" in changes and "batching" not in changes:  # its comparison was of the old stream
        changes["batching"] = ()
    if others is not None:
        changes["others_share"] = tuple((k, v) for k, v in found.others_share
                                        if k != others[0]) + (others,)
    _keep("serving", replace(found, **changes))


def keep_remote(**changes: Any) -> RemoteResults:
    """Replace some of the Serving engine page's results; a new load drops the comparison made
    on the old one. Returns the results now kept."""
    if "run" in changes and "local" not in changes:
        changes.update(local=None, local_name="", agreement=(), local_share=None)
    found = replace(app_state().remote, **changes)
    _keep("serving_engine", found)
    return found



def keep_whatif(**changes: Any) -> WhatIfResults:
    """Replace some of the What if page's results; returns them."""
    found = replace(app_state().whatif, **changes)
    _keep("whatif", found)
    return found
