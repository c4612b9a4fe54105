"""A model opened from a GGUF file runs on the file's stored blocks, memory-mapped.

- the shipped SmolLM2 Q4_1 file as `run --model PATH`: the C step reads its Q4_1 / Q8_0 blocks
  where the mapping holds them (a fifth of float32's bytes), says so on the decoder line, and its
  greedy tokens are those of the same model's transformers forward (whose linear layers multiply
  on the same blocks, engine/gguf/stored.py); tests/test_gguf_llamacpp_parity.py checks both
  against llama.cpp;
- a q4_k_m export (`export --weights q4_k_m`) of a tiny llama whose rows are whole 256-blocks,
  opened back: the step reads its Q4_K / Q6_K / Q8_0 blocks, as stored;
- a matrix type there is no kernel for: the file is refused in one line before anything loads.
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


def _torch_greedy(path, ids, n: int) -> tuple[int, ...]:
    from engine.loader import load_model

    mapped = load_model(str(path))
    with torch.no_grad():
        done = mapped.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                     pad_token_id=mapped.tokenizer.eos_token_id)
    return tuple(done[0, len(ids):].tolist())


@pytest.mark.real_model
def test_the_shipped_q4_1_file_decodes_natively_on_its_blocks(lm, tmp_path, capsys):
    from engine.forward import prepare_prompt
    from engine.loader import default_gguf_path

    tokens, err, nbytes = _run(tmp_path, capsys, str(default_gguf_path()), "--max-new-tokens", "8")
    assert "decoder: native C step (fp32 weights" in err
    assert "on the file's GGML blocks (Q4_1 ×210, Q8_0 ×1)" in err
    assert nbytes < lm.spec.weight_bytes / 5  # 5 bits a weight, not float32's 32
    want = _torch_greedy(default_gguf_path(), prepare_prompt(lm.tokenizer, PROMPT, True), 8)
    assert tokens == want[:len(tokens)] and len(tokens) >= 2


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A tiny llama (width 256, FFN 512: K-quant rows are whole 256-blocks) as an F32 GGUF,
    and the model opened from it."""
    from engine.loader import load_model

    path = tmp_path_factory.mktemp("native") / "tiny.gguf"
    path.write_bytes(gguf_bytes(metadata(hidden=256, ffn=512), tensors(hidden=256, ffn=512)))
    return path, load_model(str(path))


def test_a_q4_k_m_export_opened_back_decodes_on_its_blocks(tiny_file, tmp_path, capsys):
    path, lm = tiny_file
    exported = tmp_path / "tiny-q4_k_m.gguf"
    assert main(["export", "--format", "gguf", "--weights", "q4_k_m", "--model", str(path),
                 "--out", str(exported)]) == 0
    capsys.readouterr()
    tokens, err, _ = _run(tmp_path, capsys, str(exported), "--max-new-tokens", "6", "--raw")
    assert "decoder: native C step (fp32 weights" in err and "Q4_K ×" in err and "Q6_K ×" in err
    ids = lm.tokenizer(PROMPT)["input_ids"]  # --raw: the prompt's tokens alone
    assert tokens == _torch_greedy(exported, ids, 6)


def test_a_type_without_a_kernel_is_refused_in_one_line(tiny_file):
    from engine.gguf.header import read_header
    from engine.gguf.mapped import stored_problem

    header = read_header(tiny_file[0])
    table = header.table
    odd = tuple(replace(t, ggml_type="IQ2_XS") if t.name == "blk.1.ffn_up.weight" else t
                for t in table.tensors)
    problem = stored_problem(replace(header, table=replace(table, tensors=odd)))
    assert problem.startswith("tensor blk.1.ffn_up.weight: GGML type IQ2_XS has no kernel")
    assert "\n" not in problem
    assert stored_problem(header) is None
