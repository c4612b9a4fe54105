"""Re-running a trace with one change, on the real default model: the KV cache off must give the
same greedy tokens (the cache only saves recomputation) and the same attention to float16
precision; the chat template off must change the prompt's tokens. Then the same through the
Compare page's "Run A again with one change"."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine import GenerationSettings, generate_trace
from engine.lens.attention_stats import full_attention
from engine.lens.compare import first_difference, largest_difference, rerun_settings, token_diff
from engine.models import ModelEntry
from ui.session_model import SessionModel
from ui.state import state_of

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "compare.py")
PROMPT = "Name three colours of the rainbow."


@pytest.fixture(scope="module")
def run_a(lm):
    return generate_trace(lm, PROMPT, GenerationSettings(max_new_tokens=12, record_hidden=False,
                                                         attention_layers=(0, 29)))


def test_kv_cache_off_gives_the_same_greedy_tokens_and_attention(lm, run_a):
    settings = rerun_settings(run_a, "kv_cache", max_new_tokens=64, max_prompt_tokens=1024)
    run_b = generate_trace(lm, PROMPT, settings)
    assert not run_b.settings.kv_cache and run_b.kv_bytes == 0 < run_a.kv_bytes
    diff = token_diff(run_a, run_b)
    assert diff.identical and run_b.output_token_ids == run_a.output_token_ids
    assert run_b.attention_layers == (0, 29)
    for layer in (0, 29):
        wa, wb = full_attention(run_a, layer), full_attention(run_b, layer)
        assert largest_difference(wa, wb) < 5e-3  # float16-recorded weights, two code paths


def test_chat_template_off_changes_the_prompt_tokens(lm, run_a):
    settings = rerun_settings(run_a, "chat_template", max_new_tokens=64, max_prompt_tokens=1024)
    run_b = generate_trace(lm, PROMPT, settings)
    diff = token_diff(run_a, run_b)
    assert diff.prompt is not None
    assert diff.prompt == first_difference(run_a.prompt_token_ids, run_b.prompt_token_ids)
    assert len(run_b.prompt_token_ids) < len(run_a.prompt_token_ids)
    assert sum(run_b.prompt_special) < sum(run_a.prompt_special)  # the template's markers gone


def test_the_page_reruns_run_a_with_the_cache_off_then_without_the_template(lm, run_a):
    at = AppTest.from_file(PAGE, default_timeout=120)
    state_of(at.session_state).run.trace = run_a
    state_of(at.session_state).model = SessionModel("default", "float32", ModelEntry(lm))
    at.run()
    at.radio(key="compare_b_source").set_value("Run A again with one change").run()
    at.radio(key="compare_change").set_value("kv_cache").run()
    next(b for b in at.button if b.label == "Run again with this change").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    run_b = state_of(at.session_state).compare.b
    assert not run_b.settings.kv_cache and run_b.output_token_ids == run_a.output_token_ids
    assert state_of(at.session_state).compare.label == "re-run with the KV cache off"
    assert any(f"the same {len(run_a.steps)} tokens" in s.value for s in at.success)
    assert any("KV cache" in c.value for c in at.caption if c.value.startswith("Highlighted"))

    at.radio(key="compare_change").set_value("chat_template").run()
    next(b for b in at.button if b.label == "Run again with this change").click().run()
    assert not at.exception and not at.error
    run_b = state_of(at.session_state).compare.b
    assert not run_b.settings.chat_template
    assert any(e.label.startswith("Prompt tokens: different") for e in at.expander)


def test_the_page_refuses_a_rerun_on_other_weights_than_run_as(lm, run_a):
    """Run A decoded with q4_0 weights, the sidebar has float32: a re-run would change two things."""
    from dataclasses import replace

    from engine.records.trace import DecoderUsed

    at = AppTest.from_file(PAGE, default_timeout=120)
    state_of(at.session_state).run.trace = replace(run_a, decoder=DecoderUsed("native", None, "q4_0", 9))
    state_of(at.session_state).model = SessionModel("default", "float32", ModelEntry(lm))
    at.run()
    at.radio(key="compare_b_source").set_value("Run A again with one change").run()
    at.radio(key="compare_change").set_value("chat_template").run()
    next(b for b in at.button if b.label == "Run again with this change").click().run()
    assert not at.exception
    assert any("run A decoded with q4_0 weights" in e.value.replace("\\", "") for e in at.error)
