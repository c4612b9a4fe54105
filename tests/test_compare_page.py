"""The Compare page through AppTest on two shipped examples (no model): what it says and draws is
computed from the two chosen traces, run B is kept for a reload, and the page names what it
cannot compare."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from charts.formatting import duration, size
from engine.files import load_trace
from engine.lens.compare import token_diff
from engine.records.examples import examples
from engine.timing.metrics import summarize
from ui.state import state_of

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "compare.py")


@pytest.fixture(scope="module")
def traces():
    return {e.title: load_trace(e.path) for e in examples()}


def open_page(trace=None, model=None, b=None, b_label="") -> AppTest:
    """The page alone, its session holding this trace, model and run B."""
    at = AppTest.from_file(PAGE, default_timeout=60)
    state = state_of(at.session_state)
    state.run.trace, state.model, state.compare.b, state.compare.label = trace, model, b, b_label
    return at.run()


def choose_example_b(at: AppTest, title: str) -> AppTest:
    at.selectbox(key="compare_b_example").select(title).run()
    next(b for b in at.button if b.label == "Compare with this example").click().run()
    assert not at.exception, at.exception
    return at


def charts(at: AppTest) -> dict[str, dict]:
    return {c.key: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def test_two_examples_side_by_side(traces):
    at = open_page()
    assert not at.exception
    assert at.selectbox(key="compare_a").value == "Short Q&A"  # no current trace: an example
    assert any("Choose run B" in i.value for i in at.info)
    choose_example_b(at, "Five scripts")
    a, b = traces["Short Q&A"], traces["Five scripts"]
    diff = token_diff(a, b)
    warning = at.warning[0].value
    assert f"first differ at answer token {diff.answer}" in warning
    # the marked chip in each run's answer row is that token
    rows = [m.value for m in at.markdown if 'class="ie-chips"' in m.value]
    assert sum(r.count("ie-first-diff") for r in rows) == 4  # answer and prompt, in A and B
    # the numbers table: each run's own summary
    table = at.dataframe[1].value.set_index("")
    assert table.loc["TTFT", "run A"] == duration(summarize(a).ttft_ms)
    assert table.loc["TTFT", "run B"] == duration(summarize(b).ttft_ms)
    assert table.loc["KV cache at the end", "run B"] == size(b.kv_bytes)
    assert table.loc["median ITL", "run A"] == duration(summarize(a).itl_p50_ms)
    # the same layer and head, both recorded, on one colour scale
    figs = charts(at)
    assert at.selectbox(key="compare_layer").options == ["0", "7", "15", "22", "29"]
    ha, hb = figs["compare_heatmap_A"], figs["compare_heatmap_B"]
    assert ha["layout"]["title"]["text"] == "run A · layer 0, head 0"
    assert ha["data"][0]["zmax"] == hb["data"][0]["zmax"]
    assert len(ha["data"][0]["x"]) == len(a.prompt_token_ids)
    assert len(hb["data"][0]["x"]) == len(b.prompt_token_ids)
    latency = figs["compare_latency"]
    assert latency["data"][1]["y"] == [s.latency_ms for s in b.steps]
    # another layer and head: both maps follow
    at.selectbox(key="compare_layer").select(15).run()
    at.selectbox(key="compare_head").select(4).run()
    assert charts(at)["compare_heatmap_B"]["layout"]["title"]["text"] == "run B · layer 15, head 4"


def test_settings_that_differ_are_highlighted(traces):
    at = choose_example_b(open_page(), "Sampled: T 0.9, seed 7")
    caption = next(c.value for c in at.caption if c.value.startswith("Highlighted"))
    for name in ("prompt", "temperature", "top-p", "seed"):
        assert name in caption
    assert "KV cache" not in caption and "model" not in caption
    # the Styler's CSS travels with the table: exactly the differing rows are highlighted
    css = at.dataframe[0].proto.arrow_data.styler.styles
    names = list(at.dataframe[0].value["setting"])
    lit = {names[int(m)] for m in re.findall(r"_row(\d+)_col0", css)}
    assert lit == {"prompt", "temperature", "top-p", "seed", "max new tokens",
                   "attention layers recorded"}


def test_the_same_trace_twice_is_identical_and_its_maps_differ_by_zero(traces):
    a = traces["Short Q&A"]
    at = open_page(trace=a)
    assert at.selectbox(key="compare_a").value == "The current trace"
    at.radio(key="compare_b_source").set_value("The current trace").run()
    next(b for b in at.button if b.label == "Compare with the current trace").click().run()
    assert any(f"the same {len(a.steps)} tokens" in s.value for s in at.success)
    assert any("max |B − A| = 0" in c.value for c in at.caption)
    assert not any("ie-first-diff" in m.value for m in at.markdown)


def test_run_b_is_kept_for_a_reload(traces):
    at = choose_example_b(open_page(), "Long story: KV growth")
    kept = state_of(at.session_state).compare.b
    assert kept.steps[-1].kv_bytes == traces["Long story: KV growth"].kv_bytes
    from ui.record import KEPT
    assert {"compare_b", "compare_b_label", "compare_a"} <= set(KEPT)
    # a reload restores the kept keys into a new session: the page shows the same comparison
    again = open_page(b=kept, b_label=state_of(at.session_state).compare.label)
    assert any("Long story" in m.value for m in again.markdown if m.value.startswith("**Run A**"))
    assert not any("Choose run B" in i.value for i in again.info)


def test_a_run_without_attention_is_named(traces):
    story = traces["Long story: KV growth"]
    bare = replace(story, attention_layers=(),
                   steps=tuple(replace(s, attention=None) for s in story.steps))
    at = open_page(b=bare, b_label="bare")
    assert any("run B recorded none" in i.value for i in at.info)
    assert "compare_heatmap_A" not in charts(at)


def test_float16_rerun_is_refused_on_a_hosted_demo(monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
    at = open_page()
    at.radio(key="compare_b_source").set_value("Run A again with one change").run()
    at.radio(key="compare_change").set_value("dtype").run()
    assert any("float16 weights need the app run locally" in i.value for i in at.info)
    assert not any(b.label == "Run again with this change" for b in at.button)


def test_a_rerun_without_a_model_says_so():
    at = open_page()
    at.radio(key="compare_b_source").set_value("Run A again with one change").run()
    next(b for b in at.button if b.label == "Run again with this change").click().run()
    assert any("no model is loaded" in e.value for e in at.error)
    assert state_of(at.session_state).compare.b is None


@pytest.fixture(scope="module")
def tiny_session(tiny_lm):
    from engine import GenerationSettings, generate_trace
    from engine.models import ModelEntry
    from ui.session_model import SessionModel

    trace = generate_trace(tiny_lm, "The cat sat on the mat.",
                           GenerationSettings(max_new_tokens=6, record_hidden=False))
    return trace, SessionModel("tiny", "float32", ModelEntry(tiny_lm))


def rerun_page(tiny_session, change: str) -> AppTest:
    trace, model = tiny_session
    at = open_page(trace=trace, model=model)
    at.radio(key="compare_b_source").set_value("Run A again with one change").run()
    at.radio(key="compare_change").set_value(change).run()
    return at


def click_rerun(at: AppTest) -> AppTest:
    next(b for b in at.button if b.label == "Run again with this change").click().run()
    assert not at.exception, at.exception
    return at


def test_a_rerun_with_the_cache_off_on_a_tiny_model(tiny_session):
    at = click_rerun(rerun_page(tiny_session, "kv_cache"))
    run_b = state_of(at.session_state).compare.b
    assert not run_b.settings.kv_cache and run_b.kv_bytes == 0
    assert run_b.output_token_ids == tiny_session[0].output_token_ids
    assert not at.get("progress")  # the bar goes once the run is done


def test_a_rerun_with_an_empty_prompt_is_one_message(tiny_session):
    at = rerun_page(tiny_session, "prompt")
    at.text_area(key="compare_prompt").set_value("   ").run()
    click_rerun(at)
    assert [e.value for e in at.error] == ["re\\-run\\: the prompt is empty"]
    assert state_of(at.session_state).compare.b is None and not at.get("progress")


def test_a_rerun_on_another_model_than_run_a_says_so(tiny_session):
    story = load_trace(next(e for e in examples() if e.name == "story").path)
    at = open_page(trace=story, model=tiny_session[1])
    at.radio(key="compare_b_source").set_value("Run A again with one change").run()
    click_rerun(at)
    assert any("load run A's model" in e.value for e in at.error)
    assert state_of(at.session_state).compare.b is None
