"""The Step by step page (pages/story.py) in AppTest: every stage on two different example traces
with no model loaded, a trace without attention and one with hidden states, the buttons, the
stage picker and the keyboard script."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.files import load_trace
from engine.lens import cost_notice, notice, weights_notice
from engine.records.examples import examples
from ui.state import state_of

from .test_story_notice import with_hidden, without_attention

APP = str(Path(__file__).parents[1] / "app.py")
TRACES = {e.name: load_trace(e.path) for e in examples()}
TITLES = ["Text → tokens (BPE)", "Tokens → vectors: embeddings and RoPE",
          "Attention: Q·Kᵀ/√d, softmax, ·V", "Feed-forward network and the residual stream",
          "The next token: a distribution, then a choice", "Prefill vs decode", "The KV cache",
          "Weights in fewer bits"]
NOTICES = [notice.tokens_notice, notice.embeddings_notice, notice.attention_notice,
           notice.ffn_notice, notice.sampling_notice, cost_notice.phase_notice, cost_notice.kv_notice,
           weights_notice.weights_notice]


def story(trace) -> AppTest:
    """The app with a model that cannot load (as in class when it fails) and `trace` as the
    session's trace, on the Step by step page."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["model_source"] = "/nonexistent"
    if trace is not None:
        state_of(at.session_state).run.trace = trace
    at.run()
    at.switch_page("pages/story.py").run()
    assert not at.exception
    return at


def button(at: AppTest, key: str):
    return next(b for b in at.button if b.key == key)


def unescaped(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def shows_stage(at: AppTest, trace, k: int) -> None:
    assert not at.exception
    assert [h.value for h in at.header] == [TITLES[k]]
    assert at.get("progress")[0].proto.text == f"Stage {k + 1} of {len(TITLES)}"
    bodies = [unescaped(i.body) for i in at.info]
    assert bodies == ["**What to notice.** " + NOTICES[k](trace).text]


@pytest.mark.parametrize("name", ["qa", "sampled"])
def test_every_stage_on_an_example_trace(name):
    trace = TRACES[name]
    at = story(trace)
    charts = []
    for k in range(len(TITLES)):
        shows_stage(at, trace, k)
        assert button(at, "story_previous").disabled == (k == 0)
        assert button(at, "story_next").disabled == (k == len(TITLES) - 1)
        charts.append(len(at.get("plotly_chart")))
        if k < len(TITLES) - 1:
            button(at, "story_next").click().run()
    assert charts == [0, 1, 1, 1, 1, 1, 1, 1]  # the first stage's figure is the token chips
    assert not at.error


def test_the_two_traces_tell_different_stories():
    seen = {}
    for name in ("qa", "sampled"):
        at = story(TRACES[name])
        lines = []
        for _ in TITLES:
            lines.append(at.info[0].body)
            if not button(at, "story_next").disabled:
                button(at, "story_next").click().run()
        seen[name] = lines
    differ = [a != b for a, b in zip(seen["qa"], seen["sampled"])]
    # same model: same FFN split; the weights line differs by the run's median ITL
    assert differ == [True, True, True, False, True, True, True, True]


def test_without_attention_the_attention_stage_says_so_and_draws_nothing():
    trace = without_attention(TRACES["qa"])
    at = story(trace)
    at.selectbox(key="story_stage").set_value(2).run()
    shows_stage(at, trace, 2)
    assert "recorded without attention" in at.info[0].body
    assert len(at.get("plotly_chart")) == 0


def test_with_hidden_states_the_ffn_stage_draws_the_residual_stream():
    trace = with_hidden(TRACES["qa"], 0)
    at = story(trace)
    at.selectbox(key="story_stage").set_value(3).run()
    shows_stage(at, trace, 3)
    chart = at.get("plotly_chart")[0].proto.spec
    assert "residual stream" in chart and "no hidden states" not in at.info[0].body


def test_jump_previous_and_a_new_trace():
    at = story(TRACES["qa"])
    at.selectbox(key="story_stage").set_value(5).run()
    shows_stage(at, TRACES["qa"], 5)
    button(at, "story_previous").click().run()
    shows_stage(at, TRACES["qa"], 4)
    at.switch_page("pages/tokens.py").run()  # the stage is kept while on another page
    at.switch_page("pages/story.py").run()
    shows_stage(at, TRACES["qa"], 4)
    story_trace = TRACES["story"]
    state_of(at.session_state).run.trace = story_trace  # a new trace: the same stage, its own numbers
    at.run()
    shows_stage(at, story_trace, 4)


def test_the_keyboard_script_clicks_the_buttons_and_spares_fields():
    at = story(TRACES["qa"])
    script = at.get("html")[-1].proto.body
    for key in ("ArrowRight", "PageDown", "ArrowLeft", "PageUp", ".st-key-", "story_next",
                "story_previous", "INPUT", "TEXTAREA", "isContentEditable", "__storyKeys"):
        assert key in script


def test_without_a_trace_the_page_says_how_to_get_one():
    at = story(None)
    assert "No trace yet" in at.info[0].body
    assert not at.header


def test_a_running_trace_cut_to_its_prefill_still_tells_every_stage():
    """One step only (no decode): every stage still draws, and says there was no decode step."""
    trace = replace(TRACES["qa"].prefix(1), stop_reason="stopped")
    at = story(trace)
    for k in range(len(TITLES)):
        shows_stage(at, trace, k)
        if k < len(TITLES) - 1:
            button(at, "story_next").click().run()
    at.selectbox(key="story_stage").set_value(5).run()
    assert "no decode step" in at.info[0].body
