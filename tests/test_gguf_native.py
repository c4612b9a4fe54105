"""A model opened from a GGUF file decodes natively on the file's stored blocks (issue 29.4).

- the shipped SmolLM2 Q4_1 file as `run --model PATH`: the native step packs its Q4_1 / Q8_0
  blocks (not the float32 copy: a fifth of the bytes), says so on the decoder line, and its
  greedy tokens are the default model's (which is that file dequantized by transformers);
- a q4_k_m export (`export --weights q4_k_m`) of a tiny llama whose rows are whole 256-blocks,
  opened back: the step reads its Q4_K / Q6_K / Q8_0 blocks and decodes the tokens of the
  q4_k_m variant's own native decoder;
- a matrix type the step has no kernel for: torch decodes, with that one line as the reason.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.__main__ import main
from engine.files import load_trace
from tests.gguf_craft import gguf_bytes, metadata, tensors

PROMPT = "What is the capital of France?"


def _run(tmp_path, capsys, model: str, *args: str) -> tuple[tuple[int, ...], str, int]:
    """`run --model MODEL`: its greedy tokens, its stderr and the bytes its decoder read."""
    out = tmp_path / "run.npz"
    assert main(["run", PROMPT, "--model", model, "--no-attention", "--no-hidden", "--out",
                 str(out), *args]) == 0
    err = capsys.readouterr().err
    trace = load_trace(out)
    return trace.output_token_ids, err, trace.decoder.weight_bytes


@pytest.mark.real_model
def test_the_shipped_q4_1_file_decodes_natively_on_its_blocks_as_the_default_model(
        lm, tmp_path, capsys):
    from engine.forward import prepare_prompt
    from engine.loader import default_gguf_path

    tokens, err, nbytes = _run(tmp_path, capsys, str(default_gguf_path()), "--max-new-tokens", "8")
    assert "decoder: native C step (fp32 weights" in err
    assert "on the file's GGML blocks (Q4_1 ×210, Q8_0 ×1)" in err
    assert nbytes < lm.spec.weight_bytes / 5  # 5 bits a weight, not float32's 32
    ids = prepare_prompt(lm.tokenizer, PROMPT, True)
    with torch.no_grad():
        done = lm.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                 pad_token_id=lm.tokenizer.eos_token_id)
    want = tuple(done[0, len(ids):].tolist())
    assert tokens == want[:len(tokens)] and len(tokens) >= 2


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A tiny llama (width 256, FFN 512: K-quant rows are whole 256-blocks) as an F32 GGUF,
    and the model opened from it."""
    from engine.loader import load_model

    path = tmp_path_factory.mktemp("native") / "tiny.gguf"
    path.write_bytes(gguf_bytes(metadata(hidden=256, ffn=512), tensors(hidden=256, ffn=512)))
    return path, load_model(str(path))


def test_a_q4_k_m_export_opened_back_decodes_on_its_blocks_as_the_variant(
        tiny_file, tmp_path, capsys):
    from engine.models import build_variant

    path, lm = tiny_file
    exported = tmp_path / "tiny-q4_k_m.gguf"
    assert main(["export", "--format", "gguf", "--weights", "q4_k_m", "--model", str(path),
                 "--out", str(exported)]) == 0
    capsys.readouterr()
    tokens, err, _ = _run(tmp_path, capsys, str(exported), "--max-new-tokens", "6", "--raw")
    assert "decoder: native C step (fp32 weights" in err and "Q4_K ×" in err and "Q6_K ×" in err
    variant = build_variant(lm, "q4_k_m", 64)
    assert variant.native is not None, variant.native_problem
    ids = lm.tokenizer(PROMPT)["input_ids"]  # --raw: the prompt's tokens alone
    want, _ = variant.native.greedy(ids, 6)
    assert tokens == tuple(want)


def test_a_type_without_a_kernel_decodes_in_torch_with_the_reason(tiny_file):
    from engine.models import build_variant

    lm = tiny_file[1]
    table = lm.gguf_tensors
    odd = tuple(replace(t, ggml_type="IQ2_XS") if t.name == "blk.1.ffn_up.weight" else t
                for t in table.tensors)
    built = build_variant(replace(lm, gguf_tensors=replace(table, tensors=odd)), "fp32", 32)
    assert built.native is None
    assert built.native_problem.startswith("the native step reads F32")
    assert "blk.1.ffn_up.weight as IQ2_XS" in built.native_problem
    assert "\n" not in built.native_problem
    on_blocks = build_variant(lm, "fp32", 32).native  # the F32 file itself: its own blocks
    assert on_blocks.stored_as == "the file's GGML blocks (F32 ×15)"
