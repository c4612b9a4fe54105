"""The session's typed state: one `AppState` per browser session, a dataclass per concern, under
one session-state key (APP_STATE). Widget keys, which Streamlit needs as strings, are in
ui/keys.py; what a reload restores is ui/record.py's.

Pages read the state through the accessors here (`session_model()`, `current_trace()`, …) and
change what a reload must restore through ui/record.py's `keep_*` functions.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from engine import GenerationSettings, LoadedModel, Trace
from engine.experiments import Experiments
from engine.serving.record import ServingRun
from i18n import _
from ui.link_params import OpenedLink, Published
from ui.results import RemoteResults, ServingResults, WhatIfResults
from ui.session_model import SessionModel

APP_STATE = "app_state"  # the session-state key the whole AppState lives under


@dataclass(slots=True)
class RunState:
    """The session's trace; a run that ended before its first token (`pending`: its own prompt,
    no answer — the Generate page shows it instead of the previous trace until the next trace
    arrives; not kept for a reload); and which shipped example the trace is (`example`: its name
    and the trace's created_at, so a run of its own made later is not mistaken for it)."""

    trace: Trace | None = None
    pending: Trace | None = None
    example: tuple[str, str] | None = None


@dataclass(slots=True)
class CompareRuns:
    """Run B of the Compare page (a trace of its own) and where it came from ("example “Short
    Q&A”", "re-run with the KV cache off"); which run is A is its selector's widget key."""

    b: Trace | None = None
    label: str = ""


@dataclass(slots=True)
class LinkState:
    """Share links and the address in this session: the link applied on the first run
    (`opened`); a layer/head/step from a link or the address waiting for a trace that holds them
    (`pending_view`: None for a value left out, which means the page's default); what the link
    did and ignored (`notes`); the layer, head and step last selected on the trace (`seen`: the
    trace's id and the selection), for the address and a link made on any page; and the run this
    session published last (`published`, ui/snapshots.py)."""

    opened: bool = False
    pending_view: dict[str, int | None] | None = None
    notes: OpenedLink | None = None
    seen: tuple[tuple[str, str] | None, dict[str, int]] | None = None
    published: Published | None = None
    publish_refused: bool = False  # the store had no room for the last publish


@dataclass(slots=True)
class ViewState:
    """Presentation: the page being drawn (for chart download names) and the ?present value
    this session last acted on (None: not yet)."""

    page_title: str = ""
    present_param: bool | None = None
    lang_param: str | None = None  # the ?lang value this session last acted on


@dataclass(slots=True)
class PageState:
    """What pages keep between their own reruns (not across reloads)."""

    replays: set[str] = field(default_factory=set)  # kinds the next page run replays: trace, serving, load
    upload_error: str | None = None  # Generate: what is wrong with the trace file just opened
    compare_error: str | None = None  # Compare: why run B could not be set
    map_on: bool = False  # Embeddings: the 2-D map was asked for
    follows: tuple[Trace | None] | None = None  # Embeddings: the trace the token picker follows
    story_at: int = 0  # Step by step: the stage shown, kept while the visitor is on other pages
    opened_files: dict[str, str] = field(default_factory=dict)  # uploader key → file id opened
    branch_caches: dict[int, Any] = field(default_factory=dict)  # What if: tree node → KVSnapshot
    whatif_rebuilt: tuple[int, float] | None = None  # What if: the root cache's rebuild (positions, ms)
    whatif_at: int | None = None  # Generate's "What if …?" asked to branch the run at this token


@dataclass(slots=True, eq=False, weakref_slot=True)
class AppState:
    """Everything the app keeps for one session, by concern."""

    model: SessionModel | None = None  # the sidebar's model (None: not loaded, or failed)
    settings: GenerationSettings = field(default_factory=GenerationSettings)  # the sidebar's
    run: RunState = field(default_factory=RunState)
    experiments: Experiments = field(default_factory=Experiments)  # results on the trace
    compare: CompareRuns = field(default_factory=CompareRuns)
    serving: ServingResults = field(default_factory=ServingResults)
    remote: RemoteResults = field(default_factory=RemoteResults)
    whatif: WhatIfResults = field(default_factory=WhatIfResults)
    links: LinkState = field(default_factory=LinkState)
    view: ViewState = field(default_factory=ViewState)
    page: PageState = field(default_factory=PageState)
    memos: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # ui/memo.py: name → (key, value)
    token: str | None = None  # the session record's token (ui/record.py; ?s= in the URL)
    not_kept: set[str] = field(default_factory=set)  # items the store refused (ui/record.py)

    @property
    def trace(self) -> Trace | None:
        return self.run.trace


def state_of(session: MutableMapping[str, Any]) -> AppState:
    """The AppState held in `session` (a Streamlit session state), made on first use."""
    found = session.get(APP_STATE)
    if not isinstance(found, AppState):
        found = AppState()
        session[APP_STATE] = found
        with _LIVE_LOCK:
            _LIVE.add(found)
    return found


# Every session's state, weakly (a closed session's goes with it): ui/live.py's memory budget.
_LIVE: weakref.WeakSet[AppState] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def live_states() -> list[AppState]:
    with _LIVE_LOCK:
        return list(_LIVE)


def app_state() -> AppState:
    """This session's state."""
    return state_of(st.session_state)


def session_model() -> SessionModel | None:
    return app_state().model


def reference_model(lm: LoadedModel) -> LoadedModel:
    """The float32 model a quantization measurement quantizes and compares against — never a
    session's already quantized copy (its spec says float32 too, so q4_0 would be measured
    against q4_0)."""
    chosen = session_model()
    return chosen.reference().lm if chosen is not None else lm


def set_session_model(model: SessionModel | None) -> None:
    app_state().model = model


def loaded_model() -> LoadedModel | None:
    """This session's loaded model, or None (not loaded yet, or failed)."""
    model = session_model()
    return model.lm if model is not None else None


def generation_settings() -> GenerationSettings:
    """The sidebar's generation settings (defaults before the sidebar ran)."""
    return app_state().settings


def set_generation_settings(settings: GenerationSettings) -> None:
    app_state().settings = settings


def current_trace() -> Trace | None:
    return app_state().run.trace


def current_experiments() -> Experiments:
    return app_state().experiments


def pending_run() -> Trace | None:
    """A run that ended before its first token (see RunState.pending)."""
    return app_state().run.pending


def set_pending_run(trace: Trace | None) -> None:
    app_state().run.pending = trace


def compare_run() -> tuple[str, Trace] | None:
    """Run B of the Compare page with its label, or None."""
    runs = app_state().compare
    return None if runs.b is None else (runs.label or _("run B"), runs.b)


def serving_results() -> ServingResults:
    return app_state().serving


def last_serving_run() -> tuple[str, ServingRun] | None:
    """(label, ServingRun) of the session's last stream run, for the KV page's block tables."""
    found = serving_results()
    return None if found.run is None else (found.label, found.run)


def remote_results() -> RemoteResults:
    return app_state().remote


def whatif_results() -> WhatIfResults:
    return app_state().whatif
