"""The native step on GGML's own blocks (F16, Q5_1, Q5_K as stored; F32, Q8_0, Q4_0, Q4_1, Q5_0,
Q4_K, Q6_K re-laid), one format per matrix (fast tier).

The test data owes nothing to any quantizer: random but valid blocks (random code and scale
bytes, float16 scales of a sane size), and the reference is gguf-py's `dequantize` of those very
bytes. Each kernel's W·x must equal dequantize(blocks) @ x to float32 rounding; a tiny Llama whose
every matrix has another type (q, k, v and gate, up differing within a layer), packed from GGUF
names by `pack_blocks` (q and k rows in llama.cpp's order, as a file stores them), must give a
transformers forward's logits on the dequantized weights.
Mutants of the new kernels show the checks can fail.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

import engine.kernels.native as native
from engine.gguf.names import heads_for, unpermute
from engine.kernels.native import NativeDecoder, matvec
from engine.kernels.native_formats import GGML_TYPES, native_format
from engine.kernels.native_pack import GgmlBlocks
from tests.native_mutants import broken_sources

# The size of a weight each type's random scales give (value ≈ d · code), so that a model of
# them keeps its activations in range; the kernels' check does not depend on it.
SCALE = {"F32": 0.03, "F16": 0.03, "Q8_0": 3e-4, "Q4_0": 5e-3, "Q4_1": 3e-3, "Q5_0": 3e-3,
         "Q5_1": 2e-3, "Q4_K": 1e-4, "Q5_K": 5e-5, "Q6_K": 1e-5}


def random_blocks(type_name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(n, k / block · bytes) uint8: random codes and scale bytes, float16 scales set to
    SCALE-sized values (positive or negative; K-quant minimums positive)."""
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    count = n * k // block

    def half(values: np.ndarray) -> np.ndarray:
        return values.astype(np.float16).view(np.uint8).reshape(count, 2)

    raw = rng.integers(0, 256, (count, nbytes), dtype=np.uint8)
    size = SCALE[type_name] * rng.uniform(0.5, 1.5, count)
    signed = size * rng.choice([-1.0, 1.0], count)
    if type_name == "F32":
        raw = (size * rng.standard_normal(count)).astype(np.float32).view(np.uint8).reshape(count, 4)
    elif type_name == "F16":
        raw = half(size * rng.standard_normal(count))
    elif type_name in ("Q8_0", "Q4_0", "Q5_0"):
        raw[:, :2] = half(signed)
    elif type_name in ("Q4_1", "Q5_1"):
        raw[:, :2], raw[:, 2:4] = half(size), half(-size * rng.uniform(0, 16, count))
    elif type_name in ("Q4_K", "Q5_K"):
        raw[:, :2], raw[:, 2:4] = half(signed), half(size * rng.uniform(0, 4, count))
    else:  # Q6_K: d last
        raw[:, 208:210] = half(signed)
    return raw.reshape(n, -1)


def reference(blocks: np.ndarray, type_name: str, n: int, k: int) -> torch.Tensor:
    """gguf-py's dequantize of the blocks: (n, k) float32, the values a kernel must use."""
    values = dequantize(blocks, GGMLQuantizationType[type_name])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(n, k)


def _check_matvec(type_name: str, seed: int = 0) -> None:
    """native W·x against dequantize(blocks) @ x in float64: within 1e-5 of Σ |w·x| per row
    (float32 rounding of a dot product of 512 terms)."""
    rng = np.random.default_rng(seed)
    n, k = 40, 512  # 40 rows: one padded block
    blocks = random_blocks(type_name, n, k, rng)
    x = torch.from_numpy(rng.standard_normal(k).astype(np.float32))
    y = matvec(GgmlBlocks(type_name, (n, k), torch.from_numpy(blocks)), native_format(type_name),
               x, threads=2)
    w = reference(blocks, type_name, n, k).double()
    exact = w @ x.double()
    bound = 1e-5 * (w.abs() @ x.double().abs())
    assert ((y.double() - exact).abs() <= bound).all(), type_name


@pytest.mark.parametrize("type_name", GGML_TYPES)
def test_each_kernel_multiplies_by_exactly_the_blocks_values(type_name):
    _check_matvec(type_name)


PLAIN = ["-DPLAIN_KERNELS"]  # the plain C loops, which the AVX-512 path replaces where it exists

# (text in the C sources, its broken replacement, the type that reads it, extra compiler flags)
MUTANTS = {
    "Q5_K minimum": ("(dmin * mn[2 * c + 1]) * sx[8 * b + 2 * c + 1]",
                     "(dmin * mn[2 * c + 1]) * sx[8 * b + 2 * c]", "Q5_K", []),
    "K scales' high bits": ("sc[j + 4] = (float)((q[j + 8] & 15) | ((q[j] >> 6) << 4));",
                            "sc[j + 4] = (float)((q[j + 8] & 15) | ((q[j] >> 6) << 3));", "Q5_K",
                            []),
    "Q5_K fifth bit": ("((qh[l] >> (2 * c + 1)) & 1) << 4", "((qh[l] >> (2 * c)) & 1) << 4",
                       "Q5_K", []),
    "Q5_1 fifth bit": ("(((qh >> (j + 16)) & 1) << 4)", "(((qh >> (j + 15)) & 1) << 4)", "Q5_1",
                       []),
    # the re-laid Q5_0 / Q4_K / Q6_K records (native_groups.h), AVX-512 and plain paths
    "Q5_0 high bits": ("with_bit4(h1, m[3])", "with_bit4(h1, m[2])", "Q5_0", []),
    "Q5_0 high bits, plain": ("(float)((word >> j) & 1) * x16",
                              "(float)((word >> (j ^ 1)) & 1) * x16", "Q5_0", PLAIN),
    "Q5_0 offset": ("_mm512_set1_ps((f.format == Q5_0 ? 16.0f : 8.0f)",
                    "_mm512_set1_ps((f.format == Q5_0 ? 15.0f : 8.0f)", "Q5_0", []),
    "Q4_K minimum": ("_mm512_loadu_ps((const float*)p + 16), s, t1)",
                     "_mm512_loadu_ps((const float*)p), s, t1)", "Q4_K", []),
    "Q4_K minimum, plain": ("total[j] -= m[j] * sx[g];", "total[j] -= m[j] * sx[0];", "Q4_K",
                            PLAIN),
    "Q6_K group": ("if (f.format == Q6_K) return 16;", "if (f.format == Q6_K) return 32;", "Q6_K",
                   []),
    "Q6_K scales": ("__m512 s1 = _mm512_loadu_ps((const float*)p + 16)",
                    "__m512 s1 = _mm512_loadu_ps((const float*)p + 15)", "Q6_K", []),
}


def _has_avx512() -> bool:
    """Whether this CPU compiles the AVX-512 group kernels (native_groups.h, -march=native)."""
    from engine.cbuild import cpu_flags

    return "avx512f" in cpu_flags().split()


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_kernel_check_catches_a_broken_kernel(mutant, tmp_path, monkeypatch):
    old, new, type_name, flags = MUTANTS[mutant]
    avx512_only = "_mm512" in old or "with_bit4" in old  # code inside native_groups.h's #if
    if avx512_only and not _has_avx512():  # a mutant of code this CPU never compiles
        pytest.skip("the AVX-512 kernel is not compiled on this CPU (no avx512f)")
    monkeypatch.setattr(native, "SOURCE", broken_sources(tmp_path, old, new))
    monkeypatch.setattr(native, "FLAGS", native.FLAGS + ["-O1", *flags])  # only has to run wrong
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(AssertionError):
        _check_matvec(type_name)


# Every matrix of a 2-layer model in another type; q, k, v and gate, up differ within a layer.
LAYER_TYPES = [{"attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q6_K", "attn_output": "Q5_K",
                "ffn_gate": "Q4_1", "ffn_up": "Q8_0", "ffn_down": "F16"},
               {"attn_q": "Q5_1", "attn_k": "Q4_0", "attn_v": "F32", "attn_output": "Q6_K",
                "ffn_gate": "Q4_K", "ffn_up": "Q5_0", "ffn_down": "Q5_K"}]
HF_MATRICES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


@pytest.fixture(scope="module")
def mixed_gguf(default_tokenizer):
    """(a tiny Llama holding the dequantized values, its tensors under GGUF names): sizes that
    are whole 256-weight super-blocks (hidden 256, intermediate 512)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.loader import LoadedModel
    from engine.spec import spec_from_model

    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.requires_grad_(False)
    rng = np.random.default_rng(1)
    tensors: dict[str, GgmlBlocks | torch.Tensor] = {}
    params = dict(model.named_parameters())

    def put(gguf_name: str, hf_name: str, type_name: str) -> None:
        """The file's blocks under `gguf_name`; the model's weight their values, q and k rows
        back in transformers' order (a GGUF file's are llama.cpp's, permuted per head)."""
        weight = params[hf_name]
        n, k = weight.shape
        blocks = random_blocks(type_name, n, k, rng)
        heads = heads_for(gguf_name, config.num_attention_heads, config.num_key_value_heads)
        values = reference(blocks, type_name, n, k)
        weight.copy_(unpermute(values, heads) if heads else values)
        tensors[gguf_name] = GgmlBlocks(type_name, (n, k), torch.from_numpy(blocks))

    for layer, types in enumerate(LAYER_TYPES):
        for name, type_name in types.items():
            put(f"blk.{layer}.{name}.weight", f"model.layers.{layer}.{HF_MATRICES[name]}.weight",
                type_name)
        for gguf_norm, hf_norm in (("attn_norm", "input_layernorm"),
                                   ("ffn_norm", "post_attention_layernorm")):
            norm = params[f"model.layers.{layer}.{hf_norm}.weight"]
            norm.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, norm.shape).astype(np.float32)))
            tensors[f"blk.{layer}.{gguf_norm}.weight"] = norm.clone()
    put("token_embd.weight", "model.embed_tokens.weight", "Q8_0")  # tied: the LM head too
    tensors["output_norm.weight"] = params["model.norm.weight"].clone()
    lm = LoadedModel(model, default_tokenizer, spec_from_model(model, "tiny-gguf-mix"), "tiny",
                     torch.device("cpu"), 0.0, False)
    return lm, tensors


def test_a_model_of_mixed_types_decodes_as_transformers_on_its_dequantized_weights(mixed_gguf):
    lm, tensors = mixed_gguf
    decoder = NativeDecoder(lm, max_tokens=32, weights="gguf", blocks=tensors)
    formats = {(p.layer, p.name): p.fmt for p in decoder.parts}
    assert formats[(0, "q")] == "Q4_K" and formats[(0, "up")].name == "q8_0"
    assert formats[(1, "v")] is None and formats[(None, "lm_head")].name == "q8_0"
    ids = [1, 17, 230, 5, 99]
    token = int(decoder.prefill(ids).argmax())
    with torch.inference_mode():
        for _ in range(4):
            position = len(ids)
            ids.append(token)
            logits = decoder.step_logits(token, position).clone()
            expected = lm.model(input_ids=torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
            token = int(logits.argmax())


def test_blocks_of_another_type_or_a_missing_matrix_are_refused(mixed_gguf):
    from engine.errors import EngineError

    lm, tensors = mixed_gguf
    missing = {name: t for name, t in tensors.items() if name != "blk.1.ffn_up.weight"}
    with pytest.raises(EngineError, match="up of layer 1"):
        NativeDecoder(lm, max_tokens=8, weights="gguf", blocks=missing)
    odd = dict(tensors, **{"blk.0.attn_q.weight": replace(tensors["blk.0.attn_q.weight"],
                                                            type_name="IQ2_XS")})
    with pytest.raises(EngineError, match="IQ2_XS"):
        NativeDecoder(lm, max_tokens=8, weights="gguf", blocks=odd)
