"""GGUF export of every variant with GGML types, on tiny crafted llamas (issue 29.3).

- K-quants: a tiny llama whose rows are whole 256-blocks (width 256, FFN 512), exported as
  q4_k_m, holds llama.cpp's per-tensor mix (`kmix.tensor_types`), each tensor the K-quant
  blocks of its permuted rows; our reader and transformers' GGUF loader rebuild the same weights
  from it and decode the same greedy tokens;
- fp16, bf16, q8_0, q4_1 reopen as the variant's weights;
- the export's refusals (our own formats, a name that is not a variant);
- Qwen2's layout (q / k / v biases, no row permutation) opened, compared with transformers and
  exported back.
The files are opened as float copies (`load_model(..., on_blocks=False)`, what `export` loads to
quantize again); the memory-mapped model on the same blocks is checked against llama.cpp in
tests/test_gguf_llamacpp_parity.py.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from tests.gguf_craft import gguf_bytes, metadata, tensors

HIDDEN, FFN = 256, 512


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny llama (random weights) opened by our reader, and its folder."""
    from engine.loader import load_model

    folder = tmp_path_factory.mktemp("kq")
    path = folder / "tiny.gguf"
    path.write_bytes(gguf_bytes(metadata(hidden=HIDDEN, ffn=FFN), tensors(hidden=HIDDEN, ffn=FFN)))
    return load_model(str(path), on_blocks=False), folder


def test_q4_k_m_export_is_llama_cpps_mix_and_reads_back_alike(tiny, monkeypatch):
    import gguf
    from transformers import AutoModelForCausalLM

    from engine.gguf.export import export_gguf
    from engine.gguf.names import gguf_name, heads_for, permute
    from engine.loader import load_model
    from engine.outfile import out_file
    from engine.quant import kmix, kquants

    lm, folder = tiny
    path: Path = folder / "tiny-q4_k_m.gguf"
    done = export_gguf(lm, "q4_k_m", out_file(path, False))
    want = {gguf_name(n): t for n, t in kmix.tensor_types("q4_k_m", lm.model).items()}
    got = {t.name: t.ggml_type for t in done.table.tensors}
    assert {n: got[n] for n in want} == want
    assert {"Q4_K", "Q6_K"} <= set(want.values())  # real K-quant blocks, not only fallbacks
    params = dict(lm.model.named_parameters())
    for t in done.tensors:
        if t.name not in want:
            continue
        w = params[next(n for n in params if gguf_name(n) == t.name)].detach().float()
        heads = heads_for(t.name, 4, 2)
        w = w if heads is None else permute(w, heads)
        assert torch.equal(torch.from_numpy(t.data), kquants.quantize_blocks(w, want[t.name]))
    ours = load_model(str(path), on_blocks=False)
    # a pure function transformers calls once per module (tests/test_gguf_export.py)
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name, dtype=torch.float32)
    a, b = ours.model.state_dict(), theirs.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if k in b)
    layer = "model.layers.1.mlp.down_proj.weight"  # Q6_K on a use_more_bits layer
    stored = kquants.store_blocks(params[layer].detach(), want[gguf_name(layer)])
    assert torch.equal(a[layer], stored.dequantize())
    x = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.no_grad():
        mine = ours.model.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=2)
        other = theirs.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=2)
    assert mine.tolist() == other.tolist()


@pytest.mark.parametrize("variant", ["int8", "q3", "awq_q4_0", "q5"])
def test_a_variant_without_ggml_types_is_refused_in_one_line(variant, engine_cli, tmp_path):
    done = engine_cli("export", "--format", "gguf", "--weights", variant, "--out",
                      str(tmp_path / "x.gguf"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--weights" in done.stderr and not (tmp_path / "x.gguf").exists()


def test_the_cli_lists_what_the_exporter_takes():
    from engine.gguf.cli import _variants
    from engine.gguf.export import exportable

    assert _variants() == exportable()


def test_a_qwen2_file_opens_as_transformers_opens_it_and_exports_back(tmp_path, monkeypatch):
    """The other llama-family layout: q / k / v biases, rows in Hugging Face's order (llama.cpp
    permutes only llama files)."""
    import gguf
    from transformers import AutoModelForCausalLM

    from engine.gguf.export import export_gguf
    from engine.gguf.header import read_header
    from engine.loader import load_model
    from engine.outfile import out_file

    path = tmp_path / "qwen.gguf"
    path.write_bytes(gguf_bytes(metadata("qwen2"), tensors(biases=True)))
    ours = load_model(str(path), on_blocks=False)
    assert ours.spec.model_type == "qwen2"
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    a, b = ours.model.state_dict(), theirs.state_dict()
    assert "model.layers.0.self_attn.q_proj.bias" in a
    assert all(torch.equal(a[k], b[k]) for k in a if k in b)
    x = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.no_grad():
        mine = ours.model.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=2)
        other = theirs.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=2)
    assert mine.tolist() == other.tolist()
    back = tmp_path / "qwen-fp32.gguf"
    export_gguf(ours, "fp32", out_file(back, False))
    assert read_header(back).table.architecture == "qwen2"
    again = load_model(str(back), on_blocks=False).model.state_dict()
    assert set(again) == set(a) and all(torch.equal(again[k], a[k]) for k in a)


@pytest.mark.parametrize("variant, linear, embedding", [
    ("fp16", "F16", "F16"), ("bf16", "BF16", "BF16"), ("q8_0", "Q8_0", "Q8_0"),
    ("q4_1", "Q4_1", "Q8_0")])
def test_every_fixed_variant_exports_the_engines_weights(variant, linear, embedding, tmp_path):
    """fp16 / bf16 / q8_0 / q4_1 of a tiny llama: each tensor in its type, and the reopened
    weights are the variant's — the dtype's rounding, or `formats.rounded` (the engine's)."""
    from engine.gguf.export import export_gguf
    from engine.loader import load_model
    from engine.outfile import out_file
    from engine.quant.formats import rounded
    from engine.quant.scheme import FORMATS

    source = tmp_path / "tiny.gguf"
    source.write_bytes(gguf_bytes(metadata(), tensors()))
    lm = load_model(str(source), on_blocks=False)
    path = tmp_path / f"tiny-{variant}.gguf"
    done = export_gguf(lm, variant, out_file(path, False))
    types = {t.name: t.ggml_type for t in done.table.tensors}
    assert types["blk.1.ffn_down.weight"] == types["blk.0.attn_q.weight"] == linear
    assert types["token_embd.weight"] == embedding and types["output_norm.weight"] == "F32"
    reopened = load_model(str(path), on_blocks=False).model.state_dict()
    for name, w in lm.model.state_dict().items():
        kind = embedding if "embed" in name or "lm_head" in name else \
            linear if w.dim() == 2 else "F32"
        want = {"F32": w, "F16": w.half().float(), "BF16": w.bfloat16().float()}.get(kind)
        want = rounded(w, FORMATS[kind.lower()]) if want is None else want
        assert torch.equal(reopened[name], want), name
