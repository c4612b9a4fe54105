"""The Streamlit app through AppTest (no browser): it renders and generates."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def test_app_generates_and_shows_counters():
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception
    at.text_area[0].set_value("Say hello.")
    at.number_input[0].set_value(4)
    at.button[0].click().run()
    assert not at.exception
    labels = [m.label for m in at.metric]
    assert labels == ["TTFT", "ITL p50", "Decode", "KV cache"]
    assert at.session_state["trace"].steps
