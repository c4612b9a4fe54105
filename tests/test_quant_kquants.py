"""GGML's K-quants (engine/quant/kquants.py) and llama.cpp's per-tensor types (kmix.py).

gguf-py can quantize Q5_0 (our bytes must be its bytes) but not Q4_K or Q6_K: for those the
reference is its `dequantize`, which our own dequantization must equal bit for bit on the same
bytes, plus the error every block's stored grid allows (read from the bytes by gguf-py's own
layout code), so that bytes in a wrong place cannot pass. A few real weights of the default model
and random tensors with the corner cases (zero blocks, constant blocks, one outlier); the
all-weights cross-check against ggml-quants.c is in kquants' docstring, not here (too slow).
The types: the expected table is written from llama-quant.cpp's rule by hand, not by kmix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.quant import VARIANT_NAMES
from engine.quant.kmix import K_VARIANTS, tensor_types
from engine.quant.kquants import (
    BLOCKS,
    dequantize_blocks,
    quantize_blocks,
    stored_type,
)

TYPES = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")


def _random() -> torch.Tensor:
    """(16, 512) float32: Gaussian rows, and the corner cases a block can meet."""
    g = torch.Generator().manual_seed(29)
    w = torch.randn(16, 512, generator=g) * 0.05
    w[1, :256] = 0.0  # an all-zero super-block
    w[2, 256:] = 0.75  # a constant positive one (its min is clamped to 0)
    w[3, :256] = -0.25  # a constant negative one
    w[4, 7] = 3.0  # one outlier
    w[5, :32] = 0.0  # one zero sub-block inside a live super-block
    w[6] = torch.randn(512, generator=g) ** 3  # heavy tails
    w[7, :256] = torch.rand(256, generator=g) + 0.5  # all positive
    return w


@pytest.fixture(scope="module")
def real(lm) -> dict[str, torch.Tensor]:
    """A few of the default model's weights: down_proj (1536 columns: whole 256-blocks) of the
    first and last layer, and two 576-column ones (Q5_0 / Q8_0 only)."""
    params = dict(lm.model.named_parameters())
    names = ("model.layers.0.mlp.down_proj.weight", "model.layers.29.mlp.down_proj.weight",
             "model.layers.0.self_attn.v_proj.weight", "model.layers.15.mlp.up_proj.weight")
    return {n: params[n].detach().float() for n in names}


def _weights(real, ggml_type):
    yield "random", _random()
    for name, w in real.items():
        if w.shape[1] % BLOCKS[ggml_type][0] == 0:
            yield name, w


@pytest.mark.parametrize("ggml_type", ["Q5_0", "Q8_0"])
def test_q5_0_and_q8_0_bytes_are_gguf_pys(real, ggml_type):
    for name, w in _weights(real, ggml_type):
        ours = quantize_blocks(w, ggml_type).numpy()
        ref = gguf_quants.quantize(w.numpy(), GGMLQuantizationType[ggml_type])
        assert ours.shape == ref.shape and np.array_equal(ours, ref), name


@pytest.mark.parametrize("ggml_type", TYPES)
def test_dequantize_is_gguf_pys_bit_for_bit(real, ggml_type):
    for name, w in _weights(real, ggml_type):
        blocks = quantize_blocks(w, ggml_type)
        block, nbytes, _ = BLOCKS[ggml_type]
        assert blocks.dtype == torch.uint8 and blocks.shape == (w.shape[0], w.shape[1] // block * nbytes)
        ours = dequantize_blocks(blocks, ggml_type, tuple(w.shape)).numpy()
        ref = gguf_quants.dequantize(blocks.numpy(), GGMLQuantizationType[ggml_type])
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), name


def _grids(blocks: np.ndarray, ggml_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of the bytes, read with gguf-py's layout code: (step d, lowest value, highest
    value) of the stored grid; Q4_K groups of 32 (value d·q − dmin·m, q 0..15), Q6_K groups of
    16 (value d·q, q −32..31)."""
    b = blocks.reshape(-1, BLOCKS[ggml_type][1])
    if ggml_type == "Q4_K":
        sc, m = gguf_quants.Q4_K.get_scale_min(b[:, 4:16])  # (B, 8)
        d = b[:, :2].copy().view(np.float16).astype(np.float32) * sc
        dm = b[:, 2:4].copy().view(np.float16).astype(np.float32) * m
        return d, -dm, 15 * d - dm
    scales = b[:, 192:208].copy().view(np.int8).astype(np.float32)
    d = b[:, 208:210].copy().view(np.float16).astype(np.float32) * scales  # (B, 16)
    return np.abs(d), np.minimum(-32 * d, 31 * d), np.maximum(-32 * d, 31 * d)


@pytest.mark.parametrize("ggml_type", ["Q4_K", "Q6_K"])
def test_round_trip_error_stays_within_the_stored_grid(real, ggml_type):
    """|w − ŵ| ≤ max(d/2, how far w lies outside its group's stored grid) + float32 slack: the
    codes are the nearest grid points of the stored scales. And a 6-bit code beats a 4-bit one
    on Gaussian weights (not on this model's: they come from a Q4_1 file, whose 32-weight grids
    Q4_K nearly rebuilds, so there Q4_K's error is about Q6_K's; docs/quantization.md)."""
    group = 32 if ggml_type == "Q4_K" else 16
    for name, w in _weights(real, ggml_type):
        blocks = quantize_blocks(w, ggml_type).numpy()
        back = gguf_quants.dequantize(blocks, GGMLQuantizationType[ggml_type])
        x = w.numpy().reshape(-1, group)
        d, lo, hi = (a.reshape(-1, 1) for a in _grids(blocks, ggml_type))
        overhang = np.maximum(np.maximum(lo - x, x - hi), 0)
        slack = 2.0 ** -20 * (np.abs(x) + np.abs(lo) + np.abs(hi))
        err = np.abs(back.reshape(-1, group) - x)
        assert (err <= np.maximum(d / 2, overhang) + slack).all(), name
    w = torch.randn(64, 1536, generator=torch.Generator().manual_seed(0)) * 0.05
    rms = {t: (dequantize_blocks(quantize_blocks(w, t), t, tuple(w.shape)) - w).pow(2).mean().sqrt()
           for t in ("Q4_K", "Q6_K")}
    assert rms["Q6_K"] < rms["Q4_K"] / 3


def test_block_layout_by_hand():
    """Q6_K from block_q6_K's definition: every group of 16 holds k/32 for k = −32 … −17, so the
    group scale is 1/32 exactly, stored as int8 −128 times f16 d = −2^−12 (the last 2 bytes);
    code q = k + 32 = p % 16 at position p: ql[l] = q(l) | q(l + 64) << 4 and ql[l + 32] =
    q(l + 32) | q(l + 96) << 4 per half of 128, qh (the codes' top 2 bits) all 0. Q5_0: f16 d,
    then the fifth bits, then the low nibbles."""
    w = ((torch.arange(256) % 16 - 32).float() / 32).reshape(1, 256)
    six = quantize_blocks(w, "Q6_K")[0].numpy()
    assert six.shape == (210,)
    assert six[:128].tolist() == [(i % 16) * 17 for i in range(64)] * 2
    assert not six[128:192].any()
    assert six[192:208].view(np.int8).tolist() == [-128] * 16
    assert six[208:].tolist() == list(np.float16(-2.0 ** -12).tobytes())
    assert torch.equal(dequantize_blocks(torch.from_numpy(six), "Q6_K", (1, 256)), w)
    five = quantize_blocks(torch.full((1, 32), -1.0), "Q5_0")[0].tolist()
    assert five[:2] == list(np.float16(1 / 16).tobytes())  # d = peak / −16
    assert five[2:] == [0] * 20  # code 0 = −16 · d for every weight: no fifth bits, no nibbles
    assert quantize_blocks(torch.zeros(2, 512), "Q4_K").shape == (2, 288)


def test_a_row_that_is_not_whole_blocks_is_never_written_as_a_k_quant():
    """llama.cpp's fallback: Q4_K → Q5_0, Q6_K → Q8_0 on 576 columns; quantize_blocks refuses
    the K type itself rather than writing something else under its name."""
    assert stored_type("Q4_K", 576) == "Q5_0" and stored_type("Q6_K", 576) == "Q8_0"
    assert stored_type("Q4_K", 1536) == "Q4_K" and stored_type("Q6_K", 1536) == "Q6_K"
    assert stored_type("Q4_K", 80) == "F16"  # not whole 32-blocks either
    for t in ("Q4_K", "Q6_K"):
        with pytest.raises(ValueError, match="not whole"):
            quantize_blocks(torch.randn(4, 576), t)


LLAMA_CPP_MORE_BITS = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29}  # use_more_bits(i, 30)


def _expected(variant: str, layers: int) -> dict[str, str]:
    """llama-quant.cpp by hand for SmolLM2-135M (hidden 576, intermediate 1536, tied embedding):
    576-column tensors fall back (Q4_K → Q5_0, Q6_K → Q8_0); the tied embedding takes the output
    rule: 576 % 256 ≠ 0 → Q8_0."""
    small = {"q4_k": "Q5_0", "q4_k_m": "Q5_0", "q6_k": "Q8_0"}[variant]
    table = {"model.embed_tokens.weight": "Q8_0"}
    for i in range(layers):
        bump = variant == "q4_k_m" and i in LLAMA_CPP_MORE_BITS
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj"):
            table[f"model.layers.{i}.{part}.weight"] = small
        table[f"model.layers.{i}.self_attn.v_proj.weight"] = "Q8_0" if bump else small
        table[f"model.layers.{i}.mlp.down_proj.weight"] = (
            "Q6_K" if bump or variant == "q6_k" else "Q4_K")
    return table


@pytest.mark.parametrize("variant", K_VARIANTS)
def test_per_tensor_types_are_llama_cpps(lm, variant):
    assert variant in VARIANT_NAMES
    types = tensor_types(variant, lm.model)
    assert types == _expected(variant, 30)
    shapes = {n: p.shape for n, p in lm.model.named_parameters()}
    for name, t in types.items():  # a K type only where the row is whole 256-blocks
        assert shapes[name][1] % BLOCKS[t][0] == 0, name


def test_a_mix_stores_each_tensor_as_llama_cpp_would(default_tokenizer):
    """A random Llama whose rows are whole 256-blocks (hidden 256, intermediate 512, 4 layers,
    untied LM head), so the Q4_K_M rule shows without fallbacks: use_more_bits(i, 4) picks layers
    2 and 3 for Q6_K attn_v / ffn_down; the output tensor Q6_K, the token embedding Q4_K. The
    copy holds the blocks' dequantized values, and its bytes are the blocks' nbytes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.loader import LoadedModel
    from engine.quant.variants import round_variant
    from engine.spec import spec_from_model

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    lm = LoadedModel(model, default_tokenizer, spec_from_model(model, "wide-random-llama"), "wide",
                     torch.device("cpu"), 0.0, False)
    expected = {"model.embed_tokens.weight": "Q4_K", "lm_head.weight": "Q6_K"}
    for i in range(4):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj"):
            expected[f"model.layers.{i}.{part}.weight"] = "Q4_K"
        for part in ("self_attn.v_proj", "mlp.down_proj"):
            expected[f"model.layers.{i}.{part}.weight"] = "Q6_K" if i in (2, 3) else "Q4_K"
    assert tensor_types("q4_k_m", model) == expected
    copy, report = round_variant(lm, "q4_k_m")
    params = dict(model.named_parameters())
    block_bytes = {"Q4_K": 144, "Q6_K": 210}
    linears = sum(params[n].numel() // 256 * block_bytes[t] for n, t in expected.items()
                  if ".layers." in n)
    assert report.code_bytes + report.group_bytes == linears
    assert report.embedding_bytes == 512 * 256 * (144 + 210) // 256
    assert report.nbytes == report.formula_bytes
    down = "model.layers.3.mlp.down_proj.weight"
    w = params[down].float()
    back = dequantize_blocks(quantize_blocks(w, "Q6_K"), "Q6_K", tuple(w.shape))
    assert torch.equal(dict(copy.named_parameters())[down], back)
