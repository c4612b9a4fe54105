"""Safe to share: what one visitor does never crashes, stalls or changes another's session, and a
reload loses nothing. Streamlit's AppTest on the real default model."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import streamlit as st
from markdown_it import MarkdownIt

from engine import GenerationSettings, Run
from engine.experiments import Experiments
from engine.timing.sweeps import SweepPoint
from tests.test_app import fresh, generate
from ui.shared import LOCK
from ui.state import state_of
from ui.text import plain

pytestmark = pytest.mark.real_model  # every test here runs the app with the default model


def test_clearing_every_cache_from_a_browser_keeps_the_model_and_the_lock():
    """A browser's "clear cache" message runs cache_data.clear() and cache_resource.clear() for
    the whole process; the shared model (and its lock) must survive it."""
    at = fresh().run()
    model, lock = state_of(at.session_state).model.lm, LOCK
    st.cache_data.clear()
    st.cache_resource.clear()
    again = fresh().run()
    assert not again.exception
    assert state_of(again.session_state).model.lm is model  # no second copy loaded
    from ui.shared import LOCK as lock_after

    assert lock_after is lock


def test_a_visitors_dtype_choice_does_not_swap_another_visitors_model(monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    first = fresh().run()
    fp32 = state_of(first.session_state).model.lm
    other = fresh()
    other.session_state["weights_variant"] = "fp16"
    other.run()
    assert state_of(other.session_state).model.lm.spec.dtype == "float16"
    again = fresh().run()  # a float32 visitor's next session: the same model, not a reload
    assert state_of(again.session_state).model.lm is fp32 and fp32.spec.dtype == "float32"


def test_hosted_mode_offers_the_weights_its_cap_holds_and_says_why(monkeypatch):
    at = fresh(monkeypatch, hosted=True).run()
    assert not at.exception
    (picker,) = [s for s in at.sidebar.selectbox if s.label == "Weights"]
    assert picker.options == ["fp32 (float32)", "q4_0 (4-bit, scale per 32)"]
    assert "Hosted demo: float32 or q4_0" in picker.help
    assert not [t for t in at.sidebar.text_input if t.key == "model_source"]


def test_ceilings_are_measured_inside_the_model_turn(monkeypatch):
    seen = []

    def fake_ceilings(device, dtype="float32", refresh=False):
        seen.append(LOCK.locked())
        raise RuntimeError("stop here")

    monkeypatch.setattr("engine.kernels.microbench.ceilings", fake_ceilings)
    at = generate(fresh().run(), "Hi.", tokens=2)
    at.switch_page("pages/timing.py").run()
    next(b for b in at.button if b.label.startswith("Measure")).click().run()
    assert seen == [True]


def test_a_reload_restores_the_trace_prompt_and_experiments_as_a_copy():
    at = generate(fresh().run(), "Name a colour.", tokens=3)
    trace = state_of(at.session_state).run.trace
    token = at.query_params["s"]
    points = (SweepPoint(1, 10.0, 100.0), SweepPoint(2, 11.0, 181.8))
    from ui.shared import SESSIONS

    SESSIONS.put(token, "experiments", Experiments(sweeps={"batch": points}))
    reloaded = fresh()
    reloaded.query_params["s"] = token
    reloaded.run()
    assert not reloaded.exception
    assert state_of(reloaded.session_state).run.trace is trace
    assert reloaded.session_state["prompt"] == "Name a colour."
    assert state_of(reloaded.session_state).experiments.sweeps["batch"] == points
    assert reloaded.query_params["s"] != token  # its own record from now on
    stranger = fresh()
    stranger.query_params["s"] = "not-a-known-token"
    stranger.run()
    assert state_of(stranger.session_state).run.trace is None


def test_a_replay_of_slow_steps_ends_within_its_bound(lm):
    trace = Run(lm, "Hi", GenerationSettings(max_new_tokens=3, chat_template=False)).run_all()
    slow = replace(trace, steps=tuple(replace(s, latency_ms=600_000.0) for s in trace.steps))
    at = fresh().run()
    state_of(at.session_state).run.trace = slow
    state_of(at.session_state).page.replays.add("trace")
    start = time.monotonic()
    at.run()
    assert not at.exception and time.monotonic() - start < 25  # recorded: 30 minutes


def _long_trace(lm, tokens: int):
    """A real-model trace with a prompt of `tokens` tokens (made locally, as an upload would be)."""
    text = " ".join(["word"] * tokens)
    settings = GenerationSettings(max_new_tokens=2, chat_template=False, max_prompt_tokens=4096,
                                  attention_layers=(0,))
    return Run(lm, text, settings).run_all()


def test_hosted_one_head_view_refuses_a_long_uploaded_trace(lm, monkeypatch):
    import engine.lens.inspect_head

    lengths = []
    real = engine.lens.inspect_head.capture_qkv
    monkeypatch.setattr(engine.lens.inspect_head, "capture_qkv",
                        lambda lm_, ids, *a: lengths.append(len(ids)) or real(lm_, ids, *a))
    at = fresh(monkeypatch, hosted=True).run()
    state_of(at.session_state).run.trace = _long_trace(lm, 600)
    at.switch_page("pages/attention.py").run()
    assert not at.exception
    assert any("at most 320" in e.value for e in at.error)
    assert lengths == [601]  # asked, and refused before any forward


def test_hosted_cache_experiments_enforce_the_caps(lm, monkeypatch):
    at = fresh(monkeypatch, hosted=True).run()
    state_of(at.session_state).run.trace = _long_trace(lm, 600)
    at.switch_page("pages/kvcache.py").run()
    assert not at.exception
    assert max(at.multiselect[0].options) == "64"
    next(b for b in at.button if b.label == "Measure memory and quality").click().run()
    assert not at.exception and any("at most 320" in e.value for e in at.error)
    at.text_input[0].set_value("many words " * 200)
    at.multiselect[0].set_value([16])
    next(b for b in at.button if b.label.startswith("Run with and without")).click().run()
    assert not at.exception and any("limit is 256" in e.value for e in at.error)


def test_the_paged_blocks_view_refuses_huge_lengths():
    at = fresh().run()
    at.switch_page("pages/kvcache.py").run()
    at.text_input[-1].set_value("10, 1000000000000").run()
    assert not at.exception and any("whole numbers from 1" in e.value for e in at.error)


def test_a_long_model_id_is_one_plain_error(monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    at = fresh()
    at.session_state["model_source"] = "x~strike~" + "a" * 300  # one 309-character file name
    at.run()
    assert not at.exception
    assert state_of(at.session_state).model is None
    assert any("\\~strike\\~" in e.value for e in at.sidebar.error)


@pytest.mark.parametrize("text", ["model ~x~ failed", "file [a](http://x.y).npz", "a_b_c *d* `e`",
                                  "see https://x.y, www.x.y or me@x.y",
                                  "<b>bold</b> :red[x] $x$ # h", "1. list", "back\\slash"])
def test_plain_text_renders_as_itself_in_markdown(text):
    html = MarkdownIt("commonmark").enable("strikethrough").render(plain(text))
    assert html == f"<p>{MarkdownIt().renderInline(plain(text))}</p>\n"
    rendered = html.removeprefix("<p>").removesuffix("</p>\n")
    unescaped = rendered.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"') \
        .replace("&amp;", "&")
    assert unescaped.replace("\u2060", "") == text  # less the word joiners that stop bare links
    assert "http://" not in unescaped and "www." not in unescaped


def test_session_records_hold_at_most_their_cap_of_traces(lm):
    from ui.footprint import footprint as record_size
    from ui.shared import SESSIONS

    trace = Run(lm, "Hi", GenerationSettings(max_new_tokens=2, chat_template=False)).run_all()
    assert record_size(trace) >= sum(a.nbytes for s in trace.steps for a in (s.attention, s.hidden)
                               if isinstance(a, np.ndarray))
    assert SESSIONS.nbytes <= SESSIONS.max_bytes


def test_hosted_messages_show_no_filesystem_paths(monkeypatch):
    from ui.text import message

    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
    shown = message("the default model file is missing: /usr/lib/python3/site-packages/x.gguf")
    assert "/usr" not in shown and "missing" in shown
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    assert "usr" in message("missing: /usr/lib/x.gguf")  # locally the path helps


def test_html_in_prompts_and_pieces_is_escaped(tiny_lm):
    from charts.tokens import token_chips_html

    prompt = '<script>alert(1)</script><img src=x onerror=alert(2)> "quoted"'
    trace = Run(tiny_lm, prompt, GenerationSettings(max_new_tokens=3, seed=0)).run_all()
    html = token_chips_html(trace)
    assert "<script" not in html and "<img" not in html and "&lt;" in html


@pytest.mark.parametrize("source", ["/etc", "/dev/null", "no-such-org/no-such-model"])
def test_system_folders_and_unknown_ids_are_one_line(source):
    from engine import ModelLoadError, load_model

    with pytest.raises(ModelLoadError) as caught:
        load_model(source)
    assert "\n" not in str(caught.value)


def test_thirty_runs_in_a_row_leave_memory_flat():
    import gc

    import psutil

    at = fresh().run()
    for _ in range(5):  # warm-up: allocator pools, first-use caches
        at = generate(at, "Say hi.", tokens=2)
    # Each AppTest run builds a fresh media-file store (a real server keeps one) holding that
    # run's downloads (trace file, ~5 MB HTML report): garbage in reference cycles, collected here
    # so that what is measured is what the app keeps.
    gc.collect()
    before = psutil.Process().memory_info().rss
    for i in range(30):
        at = generate(at, f"Say hi to {i}.", tokens=2)
        assert not at.exception
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    assert grown < 64 << 20, f"RSS grew {grown / 2**20:.0f} MB over 30 runs"


def test_a_reload_keeps_the_model_box_and_the_weights(tmp_path, monkeypatch):
    missing = str(tmp_path / "my-model")
    at = fresh(monkeypatch)
    at.session_state["model_source"] = missing  # what typing it in the sidebar sets
    at.session_state["weights_variant"] = "q4_0"
    at.run()
    errors = [e.value for e in at.sidebar.error]
    assert errors  # the folder is not there: one line says so
    token = at.query_params["s"]
    reloaded = fresh(monkeypatch)
    reloaded.query_params["s"] = token
    reloaded.run()
    assert not reloaded.exception
    assert reloaded.sidebar.text_input(key="model_source").value == missing
    assert reloaded.sidebar.selectbox(key="weights_variant").value == "q4_0"
    assert [e.value for e in reloaded.sidebar.error] == errors
