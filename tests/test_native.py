"""Native C decode: the same logits, K/V and greedy tokens as transformers; clear refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

import engine.kernels.native as native
from engine.errors import EngineError, InputError
from engine.kernels.compiled import CompiledDecoder, compare_decode
from engine.kernels.microbench import HUGE_PAGE, huge_page_buffer
from engine.kernels.native import NativeDecoder, native_problem
from engine.kernels.native_pack import (
    ALIGN,
    BLOCK,
    FINAL_PARTS,
    LAYER_PARTS,
    Part,
    _blocks,
    layout,
    packed_bytes,
)

PROMPT = [1, 415, 2936, 9060, 285]


@pytest.fixture(scope="module")
def tiny_native(native_lm):
    return NativeDecoder(native_lm, max_tokens=64)


def test_logits_and_cache_equal_transformers_at_every_step(native_lm, tiny_native):
    """Each native step against a full forward of transformers over the whole sequence so far;
    the K/V it wrote against transformers' own cache (post-RoPE keys)."""
    ids = list(PROMPT)
    token = int(tiny_native.prefill(ids).argmax())
    with torch.inference_mode():
        for _ in range(6):
            position = len(ids)
            ids.append(token)
            logits = tiny_native.step_logits(token, position).clone()
            cache = DynamicCache(config=native_lm.model.config)
            expected = native_lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
            torch.testing.assert_close(logits, expected.logits[0, -1], atol=1e-4, rtol=1e-4)
            token = int(logits.argmax())
        for i, layer in enumerate(cache.layers):
            n = len(ids)
            torch.testing.assert_close(tiny_native.keys[i, :, :n], layer.keys[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(tiny_native.values[i, :, :n], layer.values[0], atol=1e-5,
                                       rtol=1e-5)


def test_greedy_tokens_equal_generate(native_lm, tiny_native):
    tokens, times = tiny_native.greedy(PROMPT, 12)
    reference = native_lm.model.generate(torch.tensor([PROMPT]), max_new_tokens=12, min_new_tokens=12,
                                       do_sample=False)[0, len(PROMPT):].tolist()
    assert tokens == reference
    assert len(times) == 11 and all(t > 0 for t in times)


def test_packed_blocks_are_k_major_with_zero_padding():
    weight = torch.arange(70 * 3, dtype=torch.float32).view(70, 3)  # (N, K)
    packed = _blocks(weight)
    assert packed.shape == (3, 3, BLOCK)  # ceil(70 / 32) blocks
    for b in range(3):
        for k in range(3):
            for j in range(BLOCK):
                row = b * BLOCK + j
                assert packed[b, k, j] == (weight[row, k] if row < 70 else 0)


def test_packed_weights_are_every_parameter_once(native_lm, tiny_native):
    """Packed floats = all parameters (tied embedding counted once, as the LM head) + vocabulary
    padding: the layout's size against the model's own tensors."""
    config = tiny_native.config
    padded_vocab = -(-config.vocab // BLOCK) * BLOCK
    params = sum(p.numel() for p in native_lm.model.parameters())
    assert tiny_native.packed.nbytes == packed_bytes(layout(config))
    parts = layout(config)
    floats = sum(p.nbytes for p in parts) // 4
    assert floats == params + (padded_vocab - config.vocab) * config.hidden
    assert tiny_native.weight_bytes == tiny_native.packed.nbytes


def _unblocked(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """(N/B, K, B) → (N, K): the inverse of the block packing, written independently."""
    blocks, k, b = packed.shape
    return packed.permute(0, 2, 1).reshape(blocks * b, k)[:rows]


def test_each_packed_part_is_where_the_layout_says(native_lm, tiny_native):
    """Read every part back from the packed buffer at its offset and compare it with the torch
    weight it came from: a part packed in the wrong place or order fails here by name."""
    model, packed = native_lm.model, tiny_native.packed
    parts = layout(tiny_native.config)
    assert [p.name for p in parts] == list(LAYER_PARTS) * len(model.model.layers) + list(FINAL_PARTS)
    assert parts[0].offset == 0
    assert all(a.offset + a.nbytes <= b.offset < a.offset + a.nbytes + ALIGN
               for a, b in zip(parts, parts[1:]))
    for part in parts:
        stored = packed[part.offset:part.offset + part.nbytes].view(torch.float32).view(part.shape)
        if part.layer is None:
            expected = {"final_norm": model.model.norm.weight, "lm_head": model.lm_head.weight}
        else:
            layer = model.model.layers[part.layer]
            attn, mlp = layer.self_attn, layer.mlp
            expected = {"in_norm": layer.input_layernorm.weight, "q": attn.q_proj.weight,
                        "k": attn.k_proj.weight, "v": attn.v_proj.weight,
                        "o": attn.o_proj.weight, "post_norm": layer.post_attention_layernorm.weight,
                        "gate": mlp.gate_proj.weight, "up": mlp.up_proj.weight,
                        "down": mlp.down_proj.weight}
        want = expected[part.name]
        where = f"{part.name} of layer {part.layer}"
        if stored.dim() == 1:
            assert torch.equal(stored, want), where
        else:
            assert torch.equal(_unblocked(stored, want.shape[0]), want), where
            assert not stored.permute(0, 2, 1).reshape(-1, want.shape[1])[want.shape[0]:].any()


def test_steps_outside_the_cache_or_vocabulary_are_refused(tiny_native):
    with pytest.raises(InputError, match="outside the native cache"):
        tiny_native.step_logits(5, 64)
    with pytest.raises(InputError, match="vocabulary"):
        tiny_native.step(10**6, 3)
    with pytest.raises(InputError, match="native cache of 64"):
        tiny_native.greedy(list(range(60)), 8)


def test_unsupported_models_get_one_line_reasons(tiny_lm, monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    assert native_problem(tiny_lm) is None
    assert "float32" in native_problem(replace(tiny_lm, model=tiny_lm.model.to(torch.float16)))
    tiny_lm.model.to(torch.float32)
    assert "CPU kernel" in native_problem(replace(tiny_lm, device=torch.device("cuda")))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100))
    assert "Llama architecture" in native_problem(replace(tiny_lm, model=gpt2))
    odd = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=48, intermediate_size=96,
                                       num_hidden_layers=1, num_attention_heads=4))
    assert "hidden size" in native_problem(replace(tiny_lm, model=odd))
    with pytest.raises(EngineError, match="hidden size"):
        NativeDecoder(replace(tiny_lm, model=odd))
    grouped = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=96, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=6,
                                           num_key_value_heads=4, head_dim=16))
    assert "whole groups" in native_problem(replace(tiny_lm, model=grouped))
    narrow = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, head_dim=8))  # q+k+v = 32
    assert "query width" in native_problem(replace(tiny_lm, model=narrow))
    monkeypatch.setattr("engine.cbuild.shutil.which", lambda _name: None)
    assert "C compiler" in native_problem(tiny_lm)


def test_a_failed_build_is_a_clear_error(tmp_path, monkeypatch):
    broken = tmp_path / "broken.c"
    broken.write_text("int decode_step( {\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(EngineError, match="compiling the native decoder failed: .*error"):
        native.build_library()


def test_huge_page_buffer_is_aligned():
    buffer = huge_page_buffer(3 * HUGE_PAGE // 4 + 5)
    assert buffer.numel() == 3 * HUGE_PAGE // 4 + 5 and buffer.dtype == torch.float32
    assert buffer.data_ptr() % HUGE_PAGE == 0


def test_eager_and_native_comparison_without_compiling(native_lm, tiny_native):
    decoder = CompiledDecoder(native_lm, max_tokens=64)
    result = compare_decode(decoder, PROMPT, new_tokens=8, rounds=2, compile=False,
                            native=tiny_native, bandwidth_mb=16)
    assert 0 < result.bandwidth_gb_s < 1e4  # best of the reads bracketing the 4 runs
    assert compare_decode(decoder, PROMPT, new_tokens=2, rounds=1, compile=False,
                          bandwidth_mb=0).bandwidth_gb_s is None
    assert list(result.steps) == ["eager", "native C"] and result.compiled_itl_ms is None
    assert result.same_tokens and result.compile_s == 0.0 and not decoder.compiled
    assert result.speedup("native C") == pytest.approx(result.eager_itl_ms / result.native_itl_ms)


def test_a_part_of_the_wrong_shape_is_refused_by_name(native_lm, monkeypatch):
    """Packing checks every part against the layout, not only the total."""
    original = native.layout

    def one_block_short(config, *formats):
        parts = original(config, *formats)
        qkv = parts[1]
        parts[1] = Part(qkv.name, qkv.layer, qkv.offset, (qkv.shape[0] - 1, *qkv.shape[1:]),
                        qkv.dtype)
        return parts

    monkeypatch.setattr(native, "layout", one_block_short)
    with pytest.raises(EngineError, match=r"cannot pack layer 0 q: shape \(\d+, 64, 32\)"):
        NativeDecoder(native_lm, max_tokens=16)
