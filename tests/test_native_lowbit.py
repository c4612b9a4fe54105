"""The native step with low-bit weights and with recording, on a tiny random Llama (fast tier).

The reference for a low-bit step is a transformers forward of the variant's copy
(engine.quant.variants.apply_variant: the same codes, dequantized to float32). Each check here
also runs once against a deliberately broken kernel (a mutated copy of native_decode.c) to show
it can fail.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

import engine.kernels.native as native
from engine.errors import InputError
from engine.kernels.native import NativeDecoder, native_problem
from engine.kernels.native_formats import uniform_formats
from engine.kernels.native_pack import ALIGN, BLOCK, NATIVE_WEIGHTS, layout, packed_bytes, quant_blocks
from engine.quant.apply import apply_variant
from engine.quant.formats import quantize
from engine.quant.scheme import FORMATS
from engine.quant.variants import embedding_weights, quantize_linears
from tests.native_mutants import broken_sources

PROMPT = [1, 415, 2936, 9060, 285]
LOW_BIT = ("int8", "q8_0", "q4_0", "q4_1")


@pytest.fixture(scope="module")
def variants(native_lm):
    return {name: apply_variant(native_lm, name)[0] for name in LOW_BIT}


def steps_match_the_reference(decoder: NativeDecoder, reference, steps: int = 6) -> None:
    """Each native step's logits against a full forward of `reference` over the sequence so far."""
    ids = list(PROMPT)
    token = int(decoder.prefill(ids).argmax())
    with torch.inference_mode():
        for _ in range(steps):
            position = len(ids)
            ids.append(token)
            logits = decoder.step_logits(token, position).clone()
            expected = reference(input_ids=torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
            token = int(logits.argmax())


@pytest.mark.parametrize("name", LOW_BIT)
def test_low_bit_logits_equal_transformers_on_the_dequantized_weights(native_lm, variants, name):
    decoder = NativeDecoder(native_lm, max_tokens=64, weights=name)
    for (n, a), b in zip(decoder.model.named_parameters(), variants[name].parameters()):
        assert torch.equal(a, b), n  # it made the variant's copy: the reference it must equal
    steps_match_the_reference(decoder, variants[name])


@pytest.mark.parametrize("name", LOW_BIT)
def test_low_bit_greedy_tokens_equal_generate_of_the_copy(native_lm, variants, name):
    decoder = NativeDecoder(replace(native_lm, model=variants[name]), max_tokens=64, weights=name)
    assert decoder.model is variants[name]  # already on the grid: packed as it is, no second copy
    tokens, _ = decoder.greedy(PROMPT, 12)
    reference = variants[name].generate(torch.tensor([PROMPT]), max_new_tokens=12,
                                        min_new_tokens=12, do_sample=False)
    assert tokens == reference[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("name", LOW_BIT)
def test_bytes_streamed_are_the_stored_codes_and_scales(native_lm, variants, name):
    """weight_bytes = the variant's stored tensors (codes, scales, Q8_0 LM head, float32 norms)
    + block padding rows + part alignment, and no more."""
    decoder = NativeDecoder(replace(native_lm, model=variants[name]), max_tokens=64, weights=name)
    stored = sum(q.nbytes for q in quantize_linears(variants[name], name).values())
    head = sum(quantize(w, FORMATS["q8_0"]).nbytes for w in embedding_weights(variants[name]))
    norms = sum(p.nbytes for n, p in variants[name].named_parameters() if n.endswith("norm.weight"))
    parts = layout(decoder.config, uniform_formats(decoder.config.layers, *NATIVE_WEIGHTS[name]))
    vocab_padding = (-decoder.config.vocab % BLOCK) * head / decoder.config.vocab
    assert decoder.weight_bytes == packed_bytes(parts)
    assert stored + head + norms <= decoder.weight_bytes
    assert decoder.weight_bytes <= stored + head + norms + vocab_padding + ALIGN * len(parts)
    fp32 = NativeDecoder(native_lm, max_tokens=64).weight_bytes
    assert decoder.weight_bytes < fp32 * 0.3  # the tiny model is mostly its (Q8_0) LM head


def _unpacked(records: torch.Tensor, bits: int, zero_point: bool, group: int) -> torch.Tensor:
    """(blocks, groups, record) bytes → (blocks·B, K) float32, written from the layout's
    description independently of the packer."""
    blocks, groups, _ = records.shape
    code_len = group * bits // 8 * BLOCK
    rows = torch.zeros(blocks * BLOCK, groups * group)
    for b in range(blocks):
        for g in range(groups):
            rec = records[b, g]
            d = rec[code_len:code_len + 2 * BLOCK].view(torch.float16).float()
            m = rec[code_len + 2 * BLOCK:code_len + 4 * BLOCK].view(torch.float16).float()
            for k in range(group):
                if bits == 8:
                    c = rec[k * BLOCK:(k + 1) * BLOCK].view(torch.int8).float()
                    w = d * c
                else:
                    byte = rec[(k // 2) * BLOCK:(k // 2 + 1) * BLOCK].to(torch.int64)
                    c = ((byte >> 4) if k % 2 else (byte & 15)).float()
                    w = d * c + m if zero_point else d * (c - 8)
                rows[b * BLOCK:(b + 1) * BLOCK, g * group + k] = w
    return rows


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "q4_0", "q4_1"])
def test_packed_records_hold_exactly_the_dequantized_weights(fmt):
    f = FORMATS[fmt]
    weight = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))  # 40: a padded block
    q = quantize(weight, f)
    records = quant_blocks(q)
    rows = _unpacked(records, f.bits, f.zero_point, f.group_for(64))
    assert torch.equal(rows[:40], q.dequantize())
    assert not rows[40:].any()  # padding rows are zero whatever their codes


def test_recorded_attention_and_hidden_states_equal_eager(native_lm):
    """At every decode step: the attention rows of the recorded layers equal eager attention's
    last query row; the hidden states equal transformers' hidden_states at the last position,
    the last row being the last decoder layer's own output (before the final norm)."""
    decoder = NativeDecoder(native_lm, max_tokens=64)
    eager = copy.deepcopy(native_lm.model)
    eager.config._attn_implementation = "eager"
    last_layer: list[torch.Tensor] = []
    eager.model.layers[-1].register_forward_hook(
        lambda module, args, output: last_layer.append(
            (output[0] if isinstance(output, tuple) else output)[0, -1]))
    ids = list(PROMPT)
    token = int(decoder.prefill(ids).argmax())
    with torch.inference_mode():
        for _ in range(5):
            position = len(ids)
            ids.append(token)
            done = decoder.step(token, position, attention_layers=(1,), hidden=True)
            out = eager(input_ids=torch.tensor([ids]), output_attentions=True,
                        output_hidden_states=True)
            assert done.attention.shape == (1, decoder.config.heads, position + 1)
            torch.testing.assert_close(done.attention[0], out.attentions[1][0, :, -1], atol=1e-5,
                                       rtol=1e-4)
            hidden = torch.stack([h[0, -1] for h in out.hidden_states[:-1]] + [last_layer[-1]])
            torch.testing.assert_close(done.hidden, hidden, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(done.logits, out.logits[0, -1], atol=1e-4, rtol=1e-4)
            token = int(done.logits.argmax())
    with pytest.raises(InputError, match="attention layers"):
        decoder.step(token, len(ids), attention_layers=(7,))
    with pytest.raises(InputError, match="once"):  # slots past the buffer, were it accepted
        decoder.step(token, len(ids), attention_layers=(0,) * 5)


def test_recording_does_not_change_the_step(native_lm):
    a = NativeDecoder(native_lm, max_tokens=32, weights="q4_0")
    b = NativeDecoder(a.lm, max_tokens=32, weights="q4_0")
    a.prefill(PROMPT)
    b.prefill(PROMPT)
    plain = a.step_logits(7, len(PROMPT)).clone()
    recorded = b.step(7, len(PROMPT), attention_layers=(0, 1), hidden=True)
    assert torch.equal(plain, recorded.logits)


def test_load_prefix_copies_a_torch_prefill(native_lm):
    decoder = NativeDecoder(native_lm, max_tokens=16)
    cache = DynamicCache(config=native_lm.model.config)
    with torch.inference_mode():
        native_lm.model(input_ids=torch.tensor([PROMPT]), cache=cache, use_cache=True)
    decoder.load_prefix(cache, len(PROMPT))
    assert torch.equal(decoder.keys[0, :, :len(PROMPT)], cache.layers[0].keys[0])
    with pytest.raises(InputError, match="native cache of 16"):
        decoder.load_prefix(cache, 17)


def test_variants_without_a_kernel_get_one_line_reasons(native_lm):
    assert native_problem(native_lm, "q4_0") is None and native_problem(native_lm, "int4") is None
    assert native_problem(native_lm, "awq_q4_0") is None and native_problem(native_lm, "q8_0") is None
    for name in ("q3", "fp16", "nope"):
        reason = native_problem(native_lm, name)
        assert reason and "\n" not in reason and name in reason


PLAIN = ["-DPLAIN_KERNELS"]  # the plain C loops, which the AVX-512 path replaces where it exists


@pytest.mark.parametrize("name", LOW_BIT)
def test_the_plain_kernels_equal_the_reference_too(native_lm, variants, name, tmp_path,
                                                   monkeypatch):
    """The portable loops (what a CPU without AVX-512 runs) against the same reference."""
    monkeypatch.setattr(native, "FLAGS", native.FLAGS + PLAIN)
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "cache"))
    decoder = NativeDecoder(replace(native_lm, model=variants[name]), max_tokens=64, weights=name)
    steps_match_the_reference(decoder, variants[name])


# (text in native_decode.c, its broken replacement, the variant that reads it, extra flags)
MUTANTS = {
    "plain Q4_0 offset": ("offset = (f.format == Q5_0 ? 16.0f : 8.0f)",
                          "offset = (f.format == Q5_0 ? 16.0f : 7.0f)", "q4_0", PLAIN),
    "plain Q4_1 minimum": ("half_to_float(m[j]) * sx[g]", "half_to_float(m[j]) * sx[0]", "q4_1",
                           PLAIN),
    "plain nibble order": ("(float)(c[j] & 15) * x0 + (float)(c[j] >> 4) * x1",
                           "(float)(c[j] & 15) * x1 + (float)(c[j] >> 4) * x0", "q4_0", PLAIN),
    "plain int8 scale": ("total[j] += half_to_float(d[j]) * a[j];", "total[j] += a[j];", "int8",
                         PLAIN),
    "half exponent": ("v.f *= 0x1p112f;", "v.f *= 0x1p111f;", "q4_1", PLAIN),
    "fast Q4_0 offset": ("_mm512_set1_ps((f.format == Q5_0 ? 16.0f : 8.0f)",
                         "_mm512_set1_ps((f.format == Q5_0 ? 16.0f : 7.0f)", "q4_0", []),
    "fast Q4_1 minimum": ("_mm512_fmadd_ps(m1, s,", "_mm512_fmadd_ps(m0, s,", "q4_1", []),
    "fast nibble order": ("_mm512_srli_epi32(v1, 4)), x1, b1)", "_mm512_srli_epi32(v1, 4)), x0, b1)",
                          "q4_0", []),
    "fast int8 codes": ("_mm_loadu_si128(c + 3))), x1", "_mm_loadu_si128(c + 2))), x1", "int8",
                        []),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_parity_check_catches_a_broken_kernel(native_lm, variants, mutant, tmp_path,
                                                 monkeypatch):
    """The mutation check: each broken copy of the C step compiles, runs, and fails the parity
    check above — so that check can fail, on the plain loops and on the AVX-512 path."""
    old, new, name, flags = MUTANTS[mutant]
    broken = broken_sources(tmp_path, old, new)
    if not flags and "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has no AVX-512: the fast path is not compiled here")
    monkeypatch.setattr(native, "SOURCE", broken)
    # -O1 after -O3: a mutant only has to compile and run wrong, and compiles in half the time.
    monkeypatch.setattr(native, "FLAGS", native.FLAGS + flags + ["-O1"])
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "cache"))
    decoder = NativeDecoder(replace(native_lm, model=variants[name]), max_tokens=64, weights=name)
    with pytest.raises(AssertionError):
        steps_match_the_reference(decoder, variants[name])


def test_half_to_float_equals_numpy_for_all_65536_halves(tmp_path):
    """The plain path's float16 → float conversion (bit arithmetic, for compilers without
    _Float16) against numpy, for every bit pattern: normals, subnormals, zeros, inf; NaN stays NaN."""
    import shutil
    import subprocess

    import numpy as np

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    harness = tmp_path / "half.c"
    harness.write_text(f'#include "{native.SOURCE}"\n#include <stdio.h>\n'
                       "int main(void) { for (unsigned h = 0; h < 65536; ++h) {"
                       " float f = half_to_float((uint16_t)h); uint32_t u; memcpy(&u, &f, 4);"
                       ' printf("%u\\n", u); } return 0; }\n')
    exe = tmp_path / "half"
    subprocess.run([compiler, "-O2", "-fopenmp", str(harness), "-o", str(exe), "-lm"], check=True)
    got = np.array(subprocess.run([str(exe)], capture_output=True, text=True, check=True)
                   .stdout.split(), dtype=np.uint64).astype(np.uint32)
    ref = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(got[~nan], ref.view(np.uint32)[~nan])
    assert np.isnan(got.view(np.float32)[nan]).all()
