"""Example traces shipped in assets/examples/: small, current, what the model does today, and every
page works on them with no model loaded."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine.files import read_trace_file
from engine.records.examples import MAX_EXAMPLE_BYTES, examples, record_example
from engine.records.tracefile import FORMAT_VERSION, META_KEY
from ui.state import state_of

APP = str(Path(__file__).parents[1] / "app.py")
PAGES = ["pages/generate.py", "pages/tokens.py", "pages/embeddings.py", "pages/attention.py",
         "pages/timing.py", "pages/kvcache.py", "pages/steps.py", "pages/story.py",
         "pages/compare.py"]
EXAMPLES = examples()


def _version(path: Path) -> int:
    with zipfile.ZipFile(path) as archive:
        meta = np.load(io.BytesIO(archive.read(META_KEY + ".npy")))
    return json.loads(meta.tobytes())["version"]


def test_three_or_more_examples_cover_the_kinds_the_app_needs():
    assert len(EXAMPLES) >= 3
    assert any(e.settings.max_new_tokens >= 150 for e in EXAMPLES)  # KV growth
    assert any(not e.settings.greedy for e in EXAMPLES)  # sampling
    assert any(any(ord(c) > 0x2000 for c in e.prompt) for e in EXAMPLES)  # several scripts


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_shipped_examples_are_small_current_and_match_their_manifest(example):
    assert example.path.is_file(), "record them: python -m engine examples"
    assert example.path.stat().st_size <= MAX_EXAMPLE_BYTES
    assert _version(example.path) == FORMAT_VERSION, "re-record: python -m engine examples"
    trace = read_trace_file(example.path).trace
    assert trace.prompt == example.prompt and trace.steps
    assert trace.settings.max_new_tokens == example.settings.max_new_tokens
    assert trace.settings.temperature == example.settings.temperature
    assert trace.model.name.startswith("SmolLM2-135M-Instruct")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_re_recording_gives_the_shipped_tokens(lm, example):
    """Greedy and seeded runs reproduce: a shipped example is what the default model does now."""
    shipped = read_trace_file(example.path).trace
    again = record_example(lm, example)
    assert again.output_token_ids == shipped.output_token_ids
    assert again.attention_layers == shipped.attention_layers


@pytest.mark.real_model
def test_opening_an_example_fills_the_prompt_box_with_its_prompt(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["model_source"] = str(tmp_path)  # no model: an example needs none
    at.session_state["replay_speed"] = "instant"
    at.run()
    at.text_area(key="prompt").set_value("my own prompt").run()
    for example in EXAMPLES[:2]:  # the second replaces the first's prompt
        next(b for b in at.button if b.key == f"example_{example.name}").click().run()
        assert not at.exception
        assert state_of(at.session_state).run.trace.prompt == example.prompt
        assert at.text_area(key="prompt").value == example.prompt


@pytest.mark.real_model
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_every_page_works_on_an_example_with_no_model(example, monkeypatch, tmp_path):
    """A model that cannot load (an empty folder) — as when it fails in front of a class."""
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["model_source"] = str(tmp_path)
    at.session_state["replay_speed"] = "instant"  # an example opens without its recorded pace
    at.run()
    assert state_of(at.session_state).model is None
    opener = next(b for b in at.button if b.key == f"example_{example.name}")
    opener.click().run()
    assert not at.exception
    assert state_of(at.session_state).run.trace.prompt == example.prompt
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, page
        assert not [e.value for e in at.error], page


def test_recording_writes_each_example_and_refuses_an_oversized_one(lm, tmp_path, monkeypatch):
    import engine.records.examples as module
    from engine.errors import EngineError

    (tmp_path / "examples.json").write_text(json.dumps([{
        "name": "tiny", "title": "t", "prompt": "Say hi.", "max_new_tokens": 3,
        "temperature": 0.0, "seed": 0, "attention_layers": [0]}]))
    written = module.record_examples(lm, tmp_path)
    assert [(e.name, size) for e, size in written] == [("tiny", (tmp_path / "tiny.npz").stat().st_size)]
    monkeypatch.setattr(module, "MAX_EXAMPLE_BYTES", 1000)
    with pytest.raises(EngineError, match="over 1,000"):
        module.record_examples(lm, tmp_path)
