"""The native step runs the K-quant weights variants (q4_k_m, q4_k, q6_k: a GGML type per
tensor, llama.cpp's rule, engine/quant/kmix.py) on their blocks as stored (fast tier); q4_k_m,
whose mix holds every type the other two use, is decoded here.

The model is a tiny random Llama shaped like SmolLM2-135M in the way that matters for the mix:
its hidden size (320) is not a whole number of 256-weight super-blocks, so q, k, v, o, gate and
up fall back to Q5_0 / Q8_0, while down (512 columns) gets Q4_K / Q6_K — and q4_k_m's bump puts
Q6_K (or its fallback Q8_0) on layer 0's attn_v and ffn_down. The reference is a transformers
forward of the variant's copy (apply_variant: the same blocks, dequantized).
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels.native import NativeDecoder, native_problem
from engine.quant.apply import apply_variant
from engine.quant.kmix import K_VARIANTS

PROMPT = [1, 17, 230, 5, 99, 301]


@pytest.fixture(scope="module")
def mix_lm(default_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.loader import LoadedModel
    from engine.spec import spec_from_model

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=512, hidden_size=320, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1,
                         max_position_embeddings=128, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.requires_grad_(False)
    for name, weight in model.named_parameters():
        if name.endswith("norm.weight"):
            weight.copy_(0.5 + torch.rand(weight.shape))
    return LoadedModel(model, default_tokenizer, spec_from_model(model, "tiny-k-mix"), "tiny",
                       torch.device("cpu"), 0.0, False)


def test_k_variants_are_native_variants(mix_lm):
    assert all(native_problem(mix_lm, name) is None for name in K_VARIANTS)


def test_q4_k_m_decodes_as_transformers_on_the_variants_copy(mix_lm):
    name = "q4_k_m"
    decoder = NativeDecoder(mix_lm, max_tokens=32, weights=name)
    copy, _ = apply_variant(mix_lm, name)
    for (n, a), b in zip(decoder.model.named_parameters(), copy.parameters()):
        assert torch.equal(a, b), n  # the decoder's reference is the variant's own copy
    kinds = {p.fmt if isinstance(p.fmt, str) else getattr(p.fmt, "name", None) for p in decoder.parts}
    assert {"Q4_K", "Q6_K", "Q5_0", "q8_0"} <= kinds, kinds  # the whole mix, fallbacks included
    tokens, _ = decoder.greedy(PROMPT, 8)
    reference = decoder.model.generate(torch.tensor([PROMPT]), max_new_tokens=8, min_new_tokens=8,
                                       do_sample=False)[0, len(PROMPT):].tolist()
    assert tokens == reference
    ids = list(PROMPT)
    decoder.prefill(ids)
    with torch.inference_mode():
        for token in tokens[:3]:
            logits = decoder.step_logits(token, len(ids)).clone()
            ids.append(token)
            full = decoder.model(input_ids=torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)


def test_a_k_variants_copy_packs_as_it_is(mix_lm):
    """Given the variant's copy (as the app's build_variant does), the decoder packs it without
    making another where its weights requantize to the same blocks (they do on this model; on
    SmolLM2 a few Q4_K / Q6_K rows do not, hence build_variant below)."""
    from dataclasses import replace

    copy, _ = apply_variant(mix_lm, "q4_k_m")
    decoder = NativeDecoder(replace(mix_lm, model=copy), max_tokens=32, weights="q4_k_m")
    assert decoder.model is copy


def test_the_apps_variant_runs_the_blocks_its_copy_came_from(mix_lm):
    """build_variant (the app's) lets the decoder make a K-quant copy, so the model the app shows
    is the one the step equals even where a copy would requantize to other blocks."""
    from engine.models import build_variant

    variant = build_variant(mix_lm, "q4_k_m", native_tokens=32)
    assert variant.native is not None and variant.native.model is variant.lm.model
    assert variant.native_problem is None and variant.weight_bytes == variant.native.report.nbytes
