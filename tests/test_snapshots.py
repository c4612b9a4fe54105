"""Published runs (ui/snapshots.py, ui/sessions.py) and the view in the address (ui/address.py).

A published run is a deep copy kept in the session store under an unguessable id: the link opens
it as recorded in another session with no model (the app runs with an empty folder as its model,
which fails to load at once); nothing the sender does later, nor anything the receiver does,
reaches it; it counts against the store's bounds; a link whose run is gone says so in one line
and opens its fallback (the example, or the prompt and settings). The address holds the
selection: a new session (a reload) and Back / Forward take it from there, other runs write the
session's into it.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine.experiments import Experiments
from engine.files import read_trace_file
from engine.records.examples import examples
from engine.timing.sweeps import SweepPoint
from ui.footprint import footprint
from ui.sessions import SessionStore
from ui.shared import PUBLISHED
from ui.state import state_of

APP = str(Path(__file__).parents[1] / "app.py")
QA = next(e for e in examples() if e.name == "qa")
QA_TRACE = read_trace_file(QA.path).trace
STORY = read_trace_file(next(e for e in examples() if e.name == "story").path).trace
RESULTS = Experiments(sweeps={"batch": (SweepPoint(1, 20.0, 50.0, (19.0, 20.0, 21.0)),
                                        SweepPoint(4, 30.0, 133.3, (30.0,)))})


@pytest.fixture(autouse=True)
def local_mode(monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")


def session(folder: Path, params: dict[str, str] | None = None, trace=None, experiments=None,
            **widgets) -> AppTest:
    """The app's first run with this URL, this trace (a run of its own) and these results (AppTest
    runs app.py, with its sidebar, on the first run only: later runs are the page's alone)."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = str(folder)  # no model: a published run never needs one
    return start(at, params, trace, experiments, **widgets)


def start(at: AppTest, params, trace, experiments, **widgets) -> AppTest:
    state = state_of(at.session_state)
    state.run.trace = trace
    if experiments is not None:
        state.experiments = experiments
    for key, value in widgets.items():
        at.session_state[key] = value
    at.query_params.update(params or {})
    return at.run()


def sharing() -> None:
    """app.py's link steps and the Share panels on every run, on a page standing for Attention."""
    from types import SimpleNamespace

    from ui.address import write_address
    from ui.links import open_link, share_view
    from ui.record import restore_session

    restore_session()
    open_link()
    share_view(SimpleNamespace(url_path="attention"))()  # app.py draws them after the page
    write_address()


def sender(trace, experiments=None, params=None, **widgets) -> AppTest:
    return start(AppTest.from_function(sharing, default_timeout=60), params, trace, experiments,
                 **widgets)


def the_link(at: AppTest, where: str = "sidebar") -> dict[str, str]:
    assert not at.exception, at.exception
    (code,) = [c.value for c in (at.sidebar if where == "sidebar" else at.main).code]
    return dict(parse_qsl(urlsplit(code).query, keep_blank_values=True))


def publish(at: AppTest, where: str = "sidebar") -> dict[str, str]:
    at.button(key=f"publish_{where}").click().run()
    return the_link(at, where)


def timings(trace) -> list[tuple[int, float, float]]:
    return [(s.token_id, s.latency_ms, s.forward_ms) for s in trace.steps]


def test_a_published_run_opens_as_recorded_with_no_model(tmp_path):
    sending = sender(QA_TRACE, RESULTS, attn_layer=3, attn_head=2)
    assert "view" not in the_link(sending)  # publishing is a click, not a side effect
    entries, held = len(PUBLISHED), PUBLISHED.nbytes
    state_of(sending.session_state).page.story_at = 2  # Step by step's third stage
    params = publish(sending)
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", params["view"])
    assert params["prompt"] == QA_TRACE.prompt  # the fallback travels in the same link
    assert (params["layer"], params["head"], params["stage"]) == ("3", "2", "3")
    assert "s" not in params
    assert len(PUBLISHED) == entries + 1 and PUBLISHED.nbytes >= held + footprint(QA_TRACE)
    assert publish(sending)["view"] == params["view"]  # the same run again: the same id

    receiver = session(tmp_path / "other", params)
    assert not receiver.exception and not [w.value for w in receiver.warning]
    assert any("Opened the run shared with this link" in i.value for i in receiver.info)
    assert not any("press Generate" in i.value for i in receiver.info)
    got = state_of(receiver.session_state)
    assert got.model is None  # no model here: nothing ran
    assert got.run.trace is not QA_TRACE and timings(got.run.trace) == timings(QA_TRACE)
    assert got.run.trace.prompt == QA_TRACE.prompt
    assert got.experiments is not RESULTS and got.experiments.sweeps == RESULTS.sweeps
    assert receiver.text_area(key="prompt").value == QA_TRACE.prompt
    assert dict(receiver.query_params) == {"s": receiver.query_params["s"], "layer": "3",
                                           "head": "2", "stage": "3"}  # the link applied, once
    assert got.page.story_at == 2
    receiver.switch_page("pages/attention.py").run()
    assert not receiver.exception
    assert (receiver.selectbox(key="attn_layer").value,
            receiver.selectbox(key="attn_head").value) == (3, 2)


def test_neither_side_reaches_the_published_copy(tmp_path):
    """The sender's later work, and the receiver's, change only their own session."""
    trace = read_trace_file(QA.path).trace  # arrays of this test's own
    sending = sender(trace, RESULTS)
    run = publish(sending)["view"]
    probs = trace.steps[0].top_probs.copy()
    trace.steps[0].top_probs[:] = 0.0  # even an in-place change of the sender's arrays
    state_of(sending.session_state).run.trace = STORY  # the sender's next run
    assert "view" not in the_link(sending.run())  # a link to the new run needs its own click

    first = session(tmp_path / "a", {"view": run})
    opened = state_of(first.session_state).run.trace
    assert opened.prompt == QA.prompt and np.array_equal(opened.steps[0].top_probs, probs)
    opened.steps[0].top_probs[:] = 1.0  # the receiver's copy is its own
    next(b for b in first.button if b.key == "example_sampled").click().run()
    second = session(tmp_path / "b", {"view": run})
    again = state_of(second.session_state).run.trace
    assert again.prompt == QA.prompt and np.array_equal(again.steps[0].top_probs, probs)
    assert again is not opened


def test_a_link_brings_the_senders_download_files(tmp_path, monkeypatch):
    """The receiver's Generate page offers the files the sender's made, not a second build (the
    report's figures cost the server a few tenths of a second at the moment a class opens it)."""
    from charts.report import report_html
    from engine.records.tracefile import trace_to_bytes
    from ui.run_files import REPORT_FILE, TRACE_FILE

    sending = sender(QA_TRACE, RESULTS)
    made = {TRACE_FILE: trace_to_bytes(QA_TRACE, RESULTS),
            REPORT_FILE: report_html(QA_TRACE, RESULTS).encode("utf-8")}
    state = state_of(sending.session_state)
    for name, data in made.items():  # what the sender's Generate page drew
        state.memos[name] = ((state.run.trace, state.experiments), data)
    run = publish(sending)["view"]

    def build(*_):
        raise AssertionError("the receiver built a download file again")

    monkeypatch.setattr("ui.run_files.report_html", build)
    monkeypatch.setattr("ui.run_files.trace_to_bytes", build)
    receiver = session(tmp_path / "other", {"view": run})
    assert not receiver.exception, receiver.exception
    got = state_of(receiver.session_state)
    for name, data in made.items():
        (trace, found), kept = got.memos[name]
        assert trace is got.run.trace and found is got.experiments and kept == data
    labels = [b.label for b in receiver.get("download_button")]
    assert labels == ["Download trace", "Download report (HTML)"]


def test_a_gone_run_says_so_in_one_line_and_opens_the_fallback(tmp_path):
    gone = "A" * 22  # a well-formed id this server never published
    at = session(tmp_path, {"view": gone, "example": "qa", "layer": "3"})
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and "no longer on this server" in warnings[0]
    assert "opens the link's example instead" in warnings[0]
    assert state_of(at.session_state).run.example[0] == "qa"
    prompt = session(tmp_path / "p", {"view": gone, "prompt": "Name three colours."})
    assert sum("no longer on this server" in w.value for w in prompt.warning) == 1
    assert prompt.text_area(key="prompt").value == "Name three colours."
    assert any("press Generate" in i.value for i in prompt.info)
    forged = session(tmp_path / "f", {"view": "../../x", "example": "qa"})
    (warning,) = [w.value for w in forged.warning]
    assert "view" in warning and "not the id of a published run" in warning


def test_share_is_on_the_page_while_presenting(tmp_path):
    at = session(tmp_path, {"present": "1"}, trace=QA_TRACE)
    assert not at.exception and at.button(key="publish_page") is not None
    presenting = sender(QA_TRACE, present=True)
    params = publish(presenting, "page")
    assert params["view"] and params["present"] == "1" and params["prompt"] == QA_TRACE.prompt


def test_the_store_keeps_published_runs_apart_and_bounded():
    now = [0.0]
    store = SessionStore(max_entries=3, max_bytes=1000, ttl_s=60,
                         size_of=lambda v: int(v.nbytes) if isinstance(v, np.ndarray) else 10,
                         clock=lambda: now[0])
    first = store.publish({"trace": np.zeros(50)})  # 400 bytes
    assert first is not None and store.nbytes == 400 and len(store) == 1
    assert store.copy(first) is None and store.copy("view:" + first) is not None  # never `s`
    assert store.published(first)["trace"].shape == (50,)
    second = store.publish({"trace": np.zeros(50)})
    assert second != first
    store.put("a", "trace", np.zeros(50))  # 1,200 bytes: the oldest (the first run) goes
    assert store.published(first) is None and store.published(second) is not None
    assert store.publish({"trace": np.zeros(200)}) is None  # larger than the whole store
    store.put("b", "prompt", "x")
    store.put("c", "prompt", "y")  # four records > 3: the least recently used, "a", goes
    assert len(store) == 3 and store.copy("a") is None and store.published(second) is not None
    third = store.publish({"trace": np.zeros(10)})
    now[0] = 61.0
    assert store.published(third) is None and len(store) == 0  # expired


def harness() -> None:
    """app.py's steps around a page on every run (restore, link, page, address), with the
    Attention selectors standing for the page."""
    import streamlit as st

    from ui.address import write_address
    from ui.keys import HEAD, LAYER
    from ui.links import open_link
    from ui.record import restore_session
    from ui.state import current_trace

    restore_session()
    open_link()
    trace = current_trace()
    if trace is not None and st.session_state.get("show_attention", True):
        st.selectbox("Layer", trace.attention_layers, key=LAYER)
        st.selectbox("Head", range(trace.model.heads), key=HEAD)
    write_address()


def harness_app(params: dict[str, str]) -> AppTest:
    at = AppTest.from_function(harness, default_timeout=60)
    state_of(at.session_state).run.trace = STORY
    at.query_params.update(params)
    return at.run()


def test_the_address_follows_the_selection_and_a_reload_restores_it():
    at = harness_app({})
    assert dict(at.query_params).keys() == {"s"}  # defaults are left out
    layer = STORY.attention_layers[1]
    at.selectbox(key="attn_layer").set_value(layer).run()
    at.selectbox(key="attn_head").set_value(5).run()
    assert (at.query_params["layer"], at.query_params["head"]) == (str(layer), "5")
    state_of(at.session_state).page.story_at = 3
    at.session_state["show_attention"] = False  # another page: the widgets forget their value
    at.run()
    at.run()
    assert (at.query_params["layer"], at.query_params["head"], at.query_params["stage"]) == (
        str(layer), "5", "4")
    at.session_state["show_attention"] = True  # back on the page: the selection is there
    at.run()
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (layer, 5)

    reload = harness_app(dict(at.query_params))  # a new session with the same address
    assert (reload.selectbox(key="attn_layer").value, reload.selectbox(key="attn_head").value) == (
        layer, 5)
    assert state_of(reload.session_state).page.story_at == 3
    assert reload.query_params["s"] != at.query_params["s"]


def test_back_and_forward_take_the_address_a_plain_rerun_does_not(monkeypatch):
    import ui.links

    at = harness_app({"layer": str(STORY.attention_layers[1]), "head": "5"})
    at.query_params["head"] = "3"  # an address the session did not write …
    at.run()
    assert at.selectbox(key="attn_head").value == 5  # … does not override the session's choice
    monkeypatch.setattr(ui.links, "history_navigation", lambda: True)
    at.query_params["head"] = "3"
    del at.query_params["layer"]  # Back to an entry without a layer: the default layer
    at.run()
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (
        STORY.attention_layers[0], 3)
