"""Weight variants on a tiny random Llama (fast tier): bytes measured = formula, the shared model
untouched, refusals in one line."""

from __future__ import annotations

import pytest
import torch

from engine.errors import InputError
from engine.quant import VARIANT_NAMES, variants
from engine.quant.apply import apply_variant
from engine.quant.kmix import K_VARIANTS
from engine.quant.variants import (
    decoder_linears,
    embedding_format,
    embedding_weights,
    quantize_linears,
    store_weight,
    weight_store,
)


def test_decoder_linears_are_the_seven_per_layer_not_the_lm_head(tiny_lm):
    names = [n for n, _ in decoder_linears(tiny_lm.model)]
    assert len(names) == 7 * 2 and not any("lm_head" in n for n in names)
    assert {n.rsplit(".", 1)[1] for n in names} == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"}


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_measured_bytes_equal_the_formula(tiny_lm, name):
    model, report = apply_variant(tiny_lm, name)
    linear_params = sum(m.weight.numel() for _, m in decoder_linears(tiny_lm.model))
    assert report.quantized_params == linear_params
    embedding = sum(w.numel() for w in embedding_weights(tiny_lm.model))
    assert report.embedding_params == embedding
    assert report.quantized_params + report.embedding_params + report.other_params == \
        tiny_lm.spec.param_count
    assert report.other_bytes == report.other_params * 4
    if name in K_VARIANTS:  # the embedding's GGML type by llama.cpp's rule (Q8_0 for rows of 64)
        store = weight_store(tiny_lm.model, name)
    else:
        fmt = embedding_format(name)
        store = lambda w: store_weight(w, fmt)  # noqa: E731
    stored = [store(w) for w in embedding_weights(tiny_lm.model)]
    assert report.embedding_bytes == sum(s.nbytes for s in stored)
    floats = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
    assert report.embedding_storage == floats.get(name, "Q8_0")
    assert report.nbytes == report.formula_bytes
    stored = quantize_linears(tiny_lm.model, name)
    assert report.code_bytes + report.group_bytes == sum(s.nbytes for s in stored.values())
    assert next(model.parameters()).dtype == torch.float32


def test_the_shared_model_is_untouched_and_nothing_is_shared(tiny_lm):
    before = {n: p.detach().clone() for n, p in tiny_lm.model.named_parameters()}
    model, _ = apply_variant(tiny_lm, "q2")
    for n, p in tiny_lm.model.named_parameters():
        assert torch.equal(p, before[n]), n
    originals = {p.data_ptr() for p in tiny_lm.model.parameters()}
    assert not originals & {p.data_ptr() for p in model.parameters()}
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(dict(model.named_parameters())[q], before[q])  # q2 did change it
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied in the copy


def test_a_model_too_big_for_memory_is_refused_before_starting(tiny_lm, monkeypatch):
    monkeypatch.setattr(variants, "available_memory", lambda: 2 * 10**6)
    monkeypatch.setattr(variants, "decoder_linears", lambda _m: pytest.fail("it started"))
    with pytest.raises(InputError, match="not started"):
        apply_variant(tiny_lm, "q4_1")


def test_an_unknown_variant_is_one_line(tiny_lm):
    with pytest.raises(InputError, match="unknown weights variant 'int4'") as err:
        apply_variant(tiny_lm, "int4")
    assert "\n" not in str(err.value)
