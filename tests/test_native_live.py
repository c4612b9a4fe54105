"""The live run on the native decode step: what it records equals the torch run's, on the real
default model (tokens against `generate`, attention against the torch run's recording, which
tests/test_parity.py checks against eager attention), and when it falls back to torch, why."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from engine import GenerationSettings, Run
from engine.errors import EngineError
from engine.forward import cache_layer_bytes, prepare_prompt
from engine.runner import native_cache_bytes

PROMPT = "Write a long, detailed story about a dragon who learns to bake bread."
N = 40
ATTENTION_ATOL = 1e-3  # tests/test_parity.py: recorded attention against eager attention
HIDDEN_TOL = 1e-4  # relative to each layer's largest |value|: C sums in another order than torch
PROBS_TOL = 1e-4  # top-k probabilities, relative


@pytest.fixture(scope="module")
def decoder(lm):
    from engine.kernels.native import NativeDecoder

    return NativeDecoder(lm, max_tokens=256)


def _settings(**changes) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=N, **changes)


@pytest.fixture(scope="module")
def native_run(lm, decoder):
    return Run(lm, PROMPT, _settings(), native=decoder).run_all()


@pytest.fixture(scope="module")
def torch_run(lm):
    return Run(lm, PROMPT, _settings(decoder="torch")).run_all()


def test_native_run_tokens_equal_generate(lm, decoder, native_run):
    ids = torch.tensor([prepare_prompt(lm.tokenizer, PROMPT, True)])
    want = lm.model.generate(ids, max_new_tokens=N, do_sample=False)[0, ids.shape[1]:]
    assert len(native_run.steps) >= 32
    assert native_run.output_token_ids == tuple(want.tolist())
    used = native_run.decoder
    assert (used.name, used.reason, used.weights) == ("native", None, "fp32")
    assert used.weight_bytes == decoder.weight_bytes and used.label == "native C step"


def test_every_decode_step_records_what_the_torch_run_records(native_run, torch_run):
    assert native_run.output_token_ids == torch_run.output_token_ids
    assert torch_run.decoder.name == "torch" and "asked for" in torch_run.decoder.reason
    assert native_run.attention_layers == torch_run.attention_layers
    for a, b in zip(native_run.steps, torch_run.steps):
        assert a.attention.dtype == np.float16 and a.attention.shape == b.attention.shape
        np.testing.assert_allclose(a.attention.astype(np.float32), b.attention.astype(np.float32),
                                   atol=ATTENTION_ATOL)
        assert a.hidden.shape == b.hidden.shape
        scale = np.abs(b.hidden).max(axis=1, keepdims=True)  # (L+1, 1)
        assert (np.abs(a.hidden - b.hidden) <= HIDDEN_TOL * scale).all(), a.index
        assert a.top_ids.tolist() == b.top_ids.tolist()
        np.testing.assert_allclose(a.top_probs, b.top_probs, rtol=PROBS_TOL, atol=1e-7)
        assert a.chosen_rank == b.chosen_rank
        assert a.kv_bytes_per_layer == b.kv_bytes_per_layer and a.kv_bytes == b.kv_bytes
        assert a.forward_ms is not None and 0 < a.forward_ms <= a.latency_ms


def test_low_bit_native_run_equals_torch_on_the_variants_copy(lm):
    from engine.kernels.native import NativeDecoder
    from engine.quant.apply import apply_variant

    decoder = NativeDecoder(lm, max_tokens=128, weights="q4_0")
    copy, report = apply_variant(lm, "q4_0")
    settings = GenerationSettings(max_new_tokens=24)
    native = Run(lm, PROMPT, settings, native=decoder).run_all()
    reference = Run(replace(lm, model=copy), PROMPT, replace(settings, decoder="torch"),
                    weights="q4_0").run_all()
    assert native.output_token_ids == reference.output_token_ids
    for a, b in zip(native.steps, reference.steps):
        assert a.top_ids.tolist() == b.top_ids.tolist()
        np.testing.assert_allclose(a.top_probs, b.top_probs, rtol=PROBS_TOL, atol=1e-7)
    assert native.decoder.weights == reference.decoder.weights == "q4_0"
    assert native.decoder.weight_bytes == decoder.weight_bytes < lm.spec.weight_bytes / 4
    # torch read the copy's dequantized float32 tensors, not the stored codes
    assert reference.decoder.weight_bytes == lm.spec.weight_bytes > report.nbytes
    ids = prepare_prompt(lm.tokenizer, PROMPT, True)
    with torch.inference_mode():  # the step's logits themselves, against the copy's forward
        decoder.prefill(ids)
        got = decoder.step(reference.steps[0].token_id, len(ids)).logits
        want = copy(input_ids=torch.tensor([ids + [reference.steps[0].token_id]])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# --- the tiny model: which decoder runs, and why not native --------------------------------


@pytest.fixture(scope="module")
def tiny_decoder(tiny_lm):
    from engine.kernels.native import NativeDecoder

    return NativeDecoder(tiny_lm, max_tokens=64)


def test_native_kv_bytes_equal_a_dynamic_caches(tiny_lm):
    cache = DynamicCache(config=tiny_lm.model.config)
    with torch.inference_mode():
        tiny_lm.model(input_ids=torch.tensor([[5, 6, 7, 8, 9]]), cache=cache, use_cache=True)
    assert native_cache_bytes(tiny_lm.spec, 5) == cache_layer_bytes(cache)
    assert sum(native_cache_bytes(tiny_lm.spec, 5)) == tiny_lm.spec.kv_bytes(5)


def test_tiny_native_run_equals_torch_run(tiny_lm, tiny_decoder):
    settings = GenerationSettings(max_new_tokens=8, chat_template=False)
    a = Run(tiny_lm, "Hello there", settings, native=tiny_decoder).run_all()
    b = Run(tiny_lm, "Hello there", replace(settings, decoder="torch")).run_all()
    assert a.decoder.name == "native" and a.output_token_ids == b.output_token_ids
    for x, y in zip(a.steps, b.steps):
        assert x.kv_bytes_per_layer == y.kv_bytes_per_layer
        np.testing.assert_allclose(x.attention.astype(np.float32), y.attention.astype(np.float32),
                                   atol=ATTENTION_ATOL)


@pytest.mark.parametrize("changes, reason", [
    ({"decoder": "torch"}, "the torch decoder was asked for"),
    ({"kv_cache": False}, "the KV cache is off"),
    ({"max_new_tokens": 70}, "exceed the native cache of 64 tokens"),
])
def test_the_torch_path_says_why(tiny_lm, tiny_decoder, changes, reason):
    settings = replace(GenerationSettings(max_new_tokens=4, chat_template=False), **changes)
    trace = Run(tiny_lm, "Hello there", settings, native=tiny_decoder).run_all()
    assert trace.decoder.name == "torch" and reason in trace.decoder.reason
    assert trace.decoder.label.startswith("torch eager — ")
    assert trace.decoder.weights == "fp32" and trace.decoder.weight_bytes == tiny_lm.spec.weight_bytes
    assert len(trace.steps) == settings.max_new_tokens


def test_a_decoder_that_cannot_be_built_gives_its_reason(tiny_lm):
    def broken():
        raise EngineError("the native decoder needs a C compiler with OpenMP (gcc); none was found")

    settings = GenerationSettings(max_new_tokens=3, chat_template=False)
    run = Run(tiny_lm, "Hello there", settings, native=broken)
    trace = run.run_all()
    assert trace.decoder.name == "torch" and "C compiler" in trace.decoder.reason
    given = Run(tiny_lm, "Hello there", settings, native_problem="no compiler here").run_all()
    assert given.decoder.reason == "no compiler here"
    none = Run(tiny_lm, "Hello there", settings).run_all()
    assert none.decoder.reason == "no native decoder was given to this run"


def test_a_builder_runs_once_the_run_starts(tiny_lm, tiny_decoder):
    calls = []

    def build():
        calls.append(1)
        return tiny_decoder

    run = Run(tiny_lm, "Hello there", GenerationSettings(max_new_tokens=3, chat_template=False),
              native=build)
    assert not calls and run.trace().decoder.name == "torch"  # not decided before it starts
    trace = run.run_all()
    assert calls == [1] and trace.decoder.name == "native"


def test_bad_decoder_setting():
    with pytest.raises(EngineError, match="decoder must be one of native, torch"):
        GenerationSettings(decoder="cuda")


def test_a_run_with_no_decode_step_does_not_claim_the_native_step(tiny_lm, tiny_decoder):
    settings = GenerationSettings(max_new_tokens=1)
    trace = Run(tiny_lm, "Hello there", settings, native=tiny_decoder).run_all()
    assert len(trace.steps) == 1
    assert trace.decoder.name == "torch" and "no decode step ran" in trace.decoder.reason
