"""The sidebar's weights variant and the live decoder: each choice is its own shared model, the
sidebar says which decoder runs (and why not native), and Generate's run uses it."""

from __future__ import annotations

import pytest

from engine.models import ModelEntry, ModelStore
from ui import config, shared
from ui.state import state_of

from .test_app import fresh, generate

pytestmark = pytest.mark.real_model


def _decoder_caption(at) -> str:
    return next(c.value for c in at.sidebar.caption if c.value.startswith("Decoder:"))


def test_local_picker_and_the_native_live_run(monkeypatch):
    at = fresh(monkeypatch).run()
    assert not at.exception
    (picker,) = [s for s in at.sidebar.selectbox if s.label == "Weights"]
    assert [o.split()[0] for o in picker.options] == list(config.LOCAL_WEIGHTS)
    assert "native C step" in _decoder_caption(at)
    at = generate(at, "Name a colour.", tokens=4)
    trace = state_of(at.session_state).run.trace
    assert (trace.decoder.name, trace.decoder.weights) == ("native", "fp32")
    assert trace.steps[1].attention is not None and trace.steps[1].hidden is not None
    summary = next(c.value for c in at.caption if "tokens generated after" in c.value)
    assert "weights fp32 (538.1 MB), decode steps by the native C step" in summary.replace("\\", "")


def test_one_visitors_q4_0_never_changes_anothers_model(monkeypatch):
    first = fresh(monkeypatch).run()
    fp32 = state_of(first.session_state).model.lm
    other = fresh()
    other.session_state["weights_variant"] = "q4_0"
    other.run()
    assert not other.exception
    chosen = state_of(other.session_state).model
    assert chosen.weights == "q4_0" and chosen.lm is not fp32 and chosen.lm.model is not fp32.model
    assert chosen.entry.stored_bytes < fp32.spec.weight_bytes / 4
    assert "native C step" in _decoder_caption(other)
    other = generate(other, "Name a colour.", tokens=4)
    trace = state_of(other.session_state).run.trace
    assert (trace.decoder.name, trace.decoder.weights) == ("native", "q4_0")
    assert trace.decoder.weight_bytes == chosen.native_decoder().weight_bytes
    again = fresh().run()  # a float32 visitor: still the float32 model
    assert state_of(again.session_state).model.lm is fp32


def test_the_sidebar_says_why_torch_runs(monkeypatch):
    at = fresh(monkeypatch)
    at.session_state["weights_variant"] = "fp16"
    at.run()
    assert "torch eager — the native step reads float32 and integer weights, not fp16" in \
        _decoder_caption(at).replace("\\", "")
    at = generate(at, "Say hi.", tokens=3)
    assert state_of(at.session_state).run.trace.decoder.name == "torch"
    off = fresh()
    off.session_state["gen_kv_cache"] = False
    off.run()
    assert "the KV cache is off" in _decoder_caption(off).replace("\\", "")


def test_a_variant_is_built_inside_the_model_turn(monkeypatch, lm):
    seen = []

    def variant(base, weights, tokens):
        seen.append((weights, shared.LOCK.locked()))
        return ModelEntry(base, weights=weights, weight_bytes=1)

    store = ModelStore(1 << 40, loader=lambda source, dtype: lm, variant=variant)
    monkeypatch.setattr(shared, "MODELS", store)
    at = fresh(monkeypatch)
    at.session_state["weights_variant"] = "int8"
    at.run()
    assert not at.exception
    assert seen == [("int8", True)]
    assert state_of(at.session_state).model.weights == "int8"


def test_a_q4_0_session_studies_against_the_float32_model(monkeypatch):
    """The Quantization study quantizes and measures from float32 even when this session decodes
    with q4_0 (its copy's spec also says float32: measured against itself, q4_0 had KL 0)."""
    at = fresh(monkeypatch)
    at.session_state["weights_variant"] = "q4_0"
    at.run()
    at.switch_page("pages/quantization.py").run()
    at.multiselect[0].set_value(["fp32", "q4_0"])
    next(b for b in at.button if b.label == "Run the comparison").click()
    at.run(timeout=900)
    assert not at.exception
    study = state_of(at.session_state).experiments.quant_study
    kl = {v.name: v.kl_mean for v in study.variants}
    assert kl["fp32"] == 0 and kl["q4_0"] > 0.5  # measured: 1.05 nats on the Gettysburg Address
