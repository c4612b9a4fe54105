"""The engine against independent references, on the real default model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from engine import GenerationSettings, generate_trace
from engine.forward import prepare_prompt

from .conftest import eager_attentions

PROMPT = "Write a long, detailed story about a dragon who learns to bake bread."
N = 40


@pytest.fixture(scope="module")
def reference_tokens(lm):
    ids = torch.tensor([prepare_prompt(lm.tokenizer, PROMPT, True)])
    out = lm.model.generate(ids, max_new_tokens=N, do_sample=False)
    return out[0, ids.shape[1]:]


@pytest.mark.parametrize("kv_cache", [True, False])
def test_greedy_tokens_equal_generate(lm, reference_tokens, kv_cache):
    trace = generate_trace(lm, PROMPT, GenerationSettings(max_new_tokens=N, kv_cache=kv_cache,
                                                          record_attention=False))
    assert len(trace.steps) >= 32, "the reference must cover at least 32 tokens"
    assert torch.equal(torch.tensor(trace.output_token_ids), reference_tokens)


def test_native_decode_tokens_equal_generate(lm, reference_tokens):
    """The hand-written C decode step (engine/kernels/native_decode.c) on the real model."""
    from engine.kernels.native import NativeDecoder

    ids = prepare_prompt(lm.tokenizer, PROMPT, True)
    tokens, _ = NativeDecoder(lm).greedy(ids, len(reference_tokens))
    assert len(tokens) >= 32
    assert torch.equal(torch.tensor(tokens), reference_tokens)


@pytest.fixture(scope="module")
def recorded(lm):
    return generate_trace(lm, "Name three colours.", GenerationSettings(max_new_tokens=6))


def test_recorded_attention_equals_eager(lm, recorded):
    full = list(recorded.prompt_token_ids) + list(recorded.output_token_ids[:-1])
    eager = eager_attentions(lm, full)
    t = len(recorded.prompt_token_ids)
    prefill = recorded.steps[0].attention.astype(np.float32)
    assert prefill.shape == (lm.spec.layers, lm.spec.heads, t, t)
    np.testing.assert_allclose(prefill, eager[:, :, :t, :t], atol=1e-3)
    for step in recorded.steps[1:]:
        s = step.context_len
        row = step.attention.astype(np.float32)
        assert row.shape == (lm.spec.layers, lm.spec.heads, 1, s)
        np.testing.assert_allclose(row[:, :, 0], eager[:, :, s - 1, :s], atol=1e-3)
    assert lm.model.config._attn_implementation == "sdpa", "recording must not stay on the model"


def test_attention_rows_are_causal_distributions(recorded):
    prefill = recorded.steps[0].attention.astype(np.float64)
    np.testing.assert_allclose(prefill.sum(-1), 1.0, atol=2e-3)
    upper = np.triu(np.ones(prefill.shape[-2:], dtype=bool), k=1)
    assert (prefill[..., upper] == 0).all()
    assert (prefill[..., ~upper] >= 0).all()
    for step in recorded.steps[1:]:
        np.testing.assert_allclose(step.attention.astype(np.float64).sum(-1), 1.0, atol=2e-3)


def test_kv_bytes_equal_tensors_and_formula(lm, recorded):
    spec = lm.spec
    # Independent measurement: a plain cache filled by the same tokens, read with .nbytes.
    cache = DynamicCache(config=lm.model.config)
    ids = list(recorded.prompt_token_ids)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
        for step in recorded.steps:
            per_layer = tuple(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
            assert step.kv_bytes_per_layer == per_layer
            assert step.kv_bytes == sum(per_layer)
            assert step.kv_bytes == 2 * 30 * 3 * 64 * 4 * step.context_len
            assert step.kv_bytes == spec.kv_bytes(step.context_len)
            lm.model(input_ids=torch.tensor([[step.token_id]]), cache=cache, use_cache=True)


def test_published_spec_of_default_model(lm):
    spec = lm.spec
    assert (spec.layers, spec.heads, spec.kv_heads, spec.head_dim) == (30, 9, 3, 64)
    assert spec.kv_bytes_per_token == 46_080  # anchors.md: 30 layers, 3 KV heads, 64, fp32
    assert spec.rope_theta == 100_000.0 and spec.vocab_size == 49_152


def test_hidden_states_are_the_residual_stream_through_the_last_layer(lm, recorded):
    """Entering every layer (transformers' hidden_states), then the last decoder layer's own
    output — read here by a hook on that layer, not on the final norm the engine hooks — whose
    final norm is transformers' last hidden state: 30 of 30 layers, none rescaled."""
    ids = torch.tensor([list(recorded.prompt_token_ids)])
    last_layer: list[torch.Tensor] = []
    hook = lm.model.model.layers[-1].register_forward_hook(
        lambda module, args, output: last_layer.append(
            (output[0] if isinstance(output, tuple) else output)[0, -1]))
    try:
        with torch.inference_mode():
            out = lm.model(input_ids=ids, output_hidden_states=True)
    finally:
        hook.remove()
    hidden = recorded.steps[0].hidden
    assert hidden.shape == (lm.spec.layers + 1, lm.spec.hidden_size) == (31, 576)
    want = torch.stack([h[0, -1] for h in out.hidden_states[:-1]] + last_layer).numpy()
    np.testing.assert_allclose(hidden, want, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():
        normed = lm.model.model.norm(torch.from_numpy(hidden[-1:])).numpy()[0]
    np.testing.assert_allclose(normed, out.hidden_states[-1][0, -1].numpy(), rtol=1e-4, atol=1e-4)


def test_topk_probabilities_are_the_models(lm, recorded):
    ids = torch.tensor([list(recorded.prompt_token_ids)])
    with torch.inference_mode():
        probs = torch.softmax(lm.model(input_ids=ids).logits[0, -1], -1)
    top = torch.topk(probs, 10)
    step = recorded.steps[0]
    assert step.top_ids.tolist() == top.indices.tolist()
    np.testing.assert_allclose(step.top_probs, top.values.numpy(), rtol=1e-4)
    assert step.token_id == step.top_ids[0] and step.chosen_rank == 0
