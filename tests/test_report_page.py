"""The Generate page's "Download report (HTML)" button, through AppTest, on an example run with
no model loaded: the report of the session's trace, serialized once per trace."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from charts.report import report_html
from ui.state import state_of

APP = str(Path(__file__).resolve().parents[1] / "app.py")
LABEL = "Download report (HTML)"


def open_example(name: str, tmp_path, monkeypatch) -> AppTest:
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["model_source"] = str(tmp_path)  # an empty folder: no model loads
    at.session_state["replay_speed"] = "instant"  # an example opens without its recorded pace
    at.run()
    next(b for b in at.button if b.key == f"example_{name}").click().run()
    assert not at.exception
    return at


def report_button(at: AppTest):
    return next(b for b in at.download_button if b.label == LABEL)


def test_generate_offers_the_report_of_the_current_trace(tmp_path, monkeypatch):
    at = open_example("qa", tmp_path, monkeypatch)
    labels = [b.label for b in at.download_button]
    assert labels == ["Download trace", LABEL]  # side by side, trace first
    button = report_button(at)
    assert button.proto.url  # bytes handed to Streamlit now, not a deferred callable
    (trace, held), data = state_of(at.session_state).memos["report_file"]
    assert trace is state_of(at.session_state).run.trace
    text = data.decode("utf-8")
    assert text.startswith("<!DOCTYPE html>") and trace.prompt in text
    # the made-at time differs, the rest is this trace's report
    fresh = report_html(trace, held, made_at="X")
    strip = "report made "
    assert text.split(strip)[0] == fresh.split(strip)[0]
    at.run()  # a rerun reuses the bytes
    assert state_of(at.session_state).memos["report_file"][1] is data

    next(b for b in at.button if b.key == "example_story").click().run()
    state = state_of(at.session_state)
    assert state.memos["report_file"][1] is not data  # a new trace, a new report
    assert state.run.trace.prompt in state.memos["report_file"][1].decode()
