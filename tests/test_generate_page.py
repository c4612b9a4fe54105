"""The Generate page through AppTest: the answer as plain text, Stop right after Generate, and a
replay that says it is one and runs at the chosen speed within its bound."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import replace

import pytest
import streamlit as st

import ui.experiment
from engine import GenerationSettings, Run
from ui.preload import CHUNKS, chunk_files
from ui.state import state_of

from .test_app import fresh, generate


def answer_blocks(at) -> list[str]:
    return [c.value for c in at.main.code]


def chips(at) -> str:
    return next(m.value for m in at.markdown if "ie-chips" in m.value)


def test_the_answer_is_shown_as_plain_text():
    at = generate(fresh().run(), "Name three colours.", tokens=6)
    assert not at.exception
    trace = state_of(at.session_state).run.trace
    assert trace.output_text.strip()
    assert answer_blocks(at) == [trace.output_text]  # one copyable block, exactly the answer


def test_stop_right_after_generate_never_shows_the_previous_answer(monkeypatch):
    at = generate(fresh().run(), "Name three colours.", tokens=4)
    old = state_of(at.session_state).run.trace
    assert old.output_text.strip() and answer_blocks(at) == [old.output_text]

    @contextlib.contextmanager
    def cut_before_the_first_token(stop=None, kind=""):
        # what a Stop click does to a run waiting for (or inside) its first step: Streamlit
        # ends the script at its next element call, before any token exists
        st.stop()
        yield stop

    monkeypatch.setattr(ui.experiment, "model_turn", cut_before_the_first_token)
    at = generate(at, "Write a poem about the sea.", tokens=4)
    monkeypatch.undo()
    next(b for b in at.button if b.label == "Stop").click()
    at.run()
    assert not at.exception
    assert answer_blocks(at) == []  # not the old answer
    shown = chips(at)
    assert "ie-gen" not in shown and "sea" in shown  # the new prompt, no generated token
    captions = " ".join(c.value for c in at.caption)
    assert "0 tokens generated" in captions and "you pressed Stop" in captions
    assert "No answer: the run ended before its first token." in captions
    # the next run replaces it as usual
    at = generate(at, "Say hi.", tokens=3)
    assert answer_blocks(at) == [state_of(at.session_state).run.trace.output_text]


@pytest.fixture(scope="module")
def recorded(lm):
    trace = Run(lm, "Hi", GenerationSettings(max_new_tokens=4, chat_template=False)).run_all()
    return replace(trace, tokenize_ms=0.0,
                   steps=tuple(replace(s, latency_ms=400.0) for s in trace.steps))


@pytest.fixture
def sleeps(monkeypatch):
    """The waits the Generate page asks for, recorded instead of slept (others still sleep)."""
    asked, real = [], time.sleep

    def fake(seconds):
        if sys._getframe(1).f_code.co_filename.endswith("replay.py"):
            asked.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr(time, "sleep", fake)
    return asked


def replay(trace, speed: str | None):
    at = fresh().run()
    state_of(at.session_state).run.trace = trace
    if speed is not None:
        at.session_state["replay_speed"] = speed
    state_of(at.session_state).page.replays.add("trace")
    return at.run()


@pytest.mark.parametrize("speed, factor", [(None, 1.0), ("1×", 1.0), ("0.5×", 2.0), ("2×", 0.5)])
def test_a_replay_says_so_and_runs_at_the_chosen_speed(recorded, sleeps, speed, factor):
    at = replay(recorded, speed)
    assert not at.exception
    banner = [i.value for i in at.info if "Replay" in i.value]
    assert len(banner) == 1 and "the model is not running" in banner[0]
    assert f"at {speed or '1×'} its recorded pace" in banner[0]
    assert sleeps == pytest.approx([0.4 * factor] * len(recorded.steps))
    assert answer_blocks(at) == [recorded.output_text]
    assert at.get("segmented_control")[0].value == (speed or "1×")


def test_an_instant_replay_does_not_wait(recorded, sleeps):
    at = replay(recorded, "instant")
    assert not at.exception and sleeps == []
    assert any("all at once" in i.value for i in at.info)


def test_a_slowed_replay_of_slow_steps_still_ends_within_its_bound(recorded, sleeps):
    slow = replace(recorded, steps=tuple(replace(s, latency_ms=600_000.0) for s in recorded.steps))
    at = replay(slow, "0.5×")
    assert not at.exception and sum(sleeps) <= 20.0 + 1e-9 and max(sleeps) <= 2.0 + 1e-9


def test_no_replay_banner_after_a_live_run():
    at = generate(fresh().run(), "Say hi.", tokens=2)
    assert not [i.value for i in at.info if "Replay" in i.value]


def test_before_the_first_run_the_chart_code_is_loaded_not_drawn():
    """Before the model runs: the metrics, empty, and where the answer will be; no chart or code
    block (compiling their browser code would hold back the first paint), but the script that has
    the browser load that code once the page is idle (ui/preload.py), before a run needs it."""
    at = fresh().run()
    assert not at.exception
    assert not at.get("plotly_chart") and answer_blocks(at) == []
    assert any("answer will appear here" in c.value for c in at.caption)
    assert [m.value for m in at.metric] == ["–"] * 5
    files = chunk_files()
    assert len(files) == len(CHUNKS)  # this Streamlit's front end still has them, one file each
    assert any(all(name in h.proto.body for name in files) for h in at.get("html"))
    after = generate(at, "Say hi.", tokens=2)
    assert not any(all(name in h.proto.body for name in files) for h in after.get("html"))
