"""The page a visitor gets while the server starts (ui/starting.py, issue 39's "never a blank
page"): drawn from Streamlit alone, with the prompt box on Generate; a prompt pressed there is
handed to the Generate page, which runs it once the model is loaded. Timed from a cold start in
real Chromium: tests/e2e/test_space.py; measured: bench/first_visit.py --cold."""

from __future__ import annotations

import threading

from streamlit.testing.v1 import AppTest

from tests.test_app import APP
from ui import startup
from ui.keys import PROMPT
from ui.starting import PENDING, TYPED
from ui.state import state_of


def starting_alone() -> None:
    from ui.starting import draw

    draw()


def test_the_starting_page_offers_the_prompt_box_and_keeps_a_press():
    at = AppTest.from_function(starting_alone, default_timeout=30).run()
    assert not at.exception and at.title[0].value == "Inference Explorer"
    assert at.text_area(key=TYPED).label == "Prompt" and len(at.button) == 1
    at.text_area(key=TYPED).set_value("Name three fruits.")
    at.button[0].click().run()
    assert at.session_state[PENDING] == "Name three fruits."
    assert "runs as soon as the model is ready" in at.info[0].value


def test_a_prompt_pressed_while_starting_runs_once_the_app_is_in(monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    for name in ("_STARTED", "_OVER"):
        monkeypatch.setattr(startup, name, threading.Event())
    startup._STARTED.set()  # a start-up thread works: the first script run waits on the page
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state[PENDING] = "Name three fruits."  # what the starting page's Generate kept
    settle = threading.Timer(1.0, startup._OVER.set)
    settle.start()
    at.run()
    settle.join()
    assert not at.exception, at.exception
    trace = state_of(at.session_state).run.trace
    assert trace is not None and trace.prompt == "Name three fruits." and trace.steps
    assert at.session_state[PROMPT] == "Name three fruits." and PENDING not in at.session_state
