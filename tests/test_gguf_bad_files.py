"""Damaged and hostile GGUF files (issue 29.4): each is refused by `python -m engine` with status 2
and one line on stderr — no traceback, no random weights in place of a missing tensor — and with
bounded memory: each case runs with an address-space cap (RLIMIT_AS) 2 GB above what the process
had mapped, so a reader that believed a count of 2^40 or a 10^12-element tensor would die of it
(MemoryError, a traceback) instead of refusing.

The files are crafted byte by byte (tests/gguf_craft.py), from a tiny valid llama (2 layers, 64
wide, 260 tokens: 380 KB), which itself opens and decodes (the control: a reader that refused
everything would pass the rest).
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gguf_craft import HIDDEN, VOCAB, gguf_bytes, metadata, s, tensors

ROOT = Path(__file__).resolve().parents[1]
CAP = 2 << 30  # bytes of address space a case may add
def write(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(content)
    return str(path)


def refused(engine_cli, args: list[str], says: str) -> None:
    done = engine_cli(*args, memory_cap=CAP)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert says in lines[0], lines[0]
    assert "Traceback" not in done.stderr


VALID = gguf_bytes(metadata(), tensors())
BIG = 1 << 40


def _header_cases() -> list[tuple[str, bytes, str]]:
    """(case, file, what the line says): wrong at the level of the file's structure."""
    meta = metadata()
    start = 4 + 4 + 8 + 8
    tokens_at = VALID.index(s("tokenizer.ggml.tokens")) + len(s("tokenizer.ggml.tokens"))
    key_at = start  # the first key's length
    value_at = VALID.index(s("general.name")) + len(s("general.name")) + 4
    return [
        ("wrong magic", b"GGML" + VALID[4:], "GGUF magic"),
        ("truncated in the header", VALID[:200], "truncated"),
        ("truncated in the data", VALID[:len(VALID) * 2 // 3], "past the end"),
        ("tensor count 2^40", gguf_bytes(meta, tensors(), tensor_count=BIG), "cannot fit"),
        ("metadata count 2^40", gguf_bytes(meta, tensors(), kv_count=BIG), "cannot fit"),
        ("key length 2^40", VALID[:key_at] + struct.pack("<Q", BIG) + VALID[key_at + 8:],
         "claims 1,099,511,627,776 bytes"),
        ("string length 2^40", VALID[:value_at] + struct.pack("<Q", BIG) + VALID[value_at + 8:],
         "1,099,511,627,776 bytes"),
        ("array count 2^40", VALID[:tokens_at + 8] + struct.pack("<Q", BIG)  # after 2 types
         + VALID[tokens_at + 16:], "claims 1,099,511,627,776 elements"),
        ("10^12-element tensor", gguf_bytes(meta, tensors(), claim={
            "blk.1.ffn_down.weight": (1_000_000, 1_000_000)}), "past the end"),
        ("a tensor larger than its bytes", gguf_bytes(meta, tensors(), claim={
            "output_norm.weight": (HIDDEN * 4,)}), "past the end"),
        ("every tensor at offset 0", gguf_bytes(meta, tensors(), at_zero=True),
         "starts inside tensor"),
    ]


def _model_cases() -> list[tuple[str, bytes, str]]:
    """Structurally sound files that do not hold a whole llama-family model."""
    return [
        ("unknown architecture", gguf_bytes(metadata("mamba"), tensors()),
         "architecture 'mamba' is not one this engine opens"),
        ("an encoder", gguf_bytes(metadata("bert", **{"ARCH.pooling_type": 1}), tensors()),
         "encoder, not a decoder-only"),
        ("a missing tensor", gguf_bytes(metadata(), tensors(drop="blk.1.ffn_up.weight")),
         "tensor blk.1.ffn_up.weight is missing"),
        ("sizes that disagree with the header", gguf_bytes(
            metadata(**{"ARCH.feed_forward_length": 256}), tensors()),
         "blk.0.ffn_gate.weight is 128 × 64, but the settings"),
        ("sizes that disagree with the head count", gguf_bytes(
            metadata(**{"ARCH.attention.head_count_kv": 4}), tensors()),
         "blk.0.attn_k.weight is 32 × 64"),
        ("a missing setting", gguf_bytes(metadata(**{"ARCH.block_count": None}), tensors()),
         "llama.block_count is missing"),
        ("a tensor of another model", gguf_bytes(metadata(), tensors() + [
            ("blk.0.ffn_gate_exps.weight", (HIDDEN,))]), "not part of a llama model"),
        ("a block count of 2^31 - 1", gguf_bytes(metadata(**{"ARCH.block_count": 2**31 - 1}),
                                                  tensors()), "2,147,483,647 layers"),
        ("an expert count given as an array", gguf_bytes(
            metadata(**{"ARCH.expert_count": [1, 2]}), tensors()), "mixture-of-experts"),
        ("YaRN RoPE scaling", gguf_bytes(metadata(**{"ARCH.rope.scaling.type": "yarn"}),
                                         tensors()), "RoPE scaling 'yarn' is not supported"),
        ("no vocabulary", gguf_bytes(metadata(**{"tokenizer.ggml.tokens": None,
                                                 "ARCH.vocab_size": VOCAB}), tensors()),
         "no vocabulary"),
        ("an RMS epsilon of 1e38", gguf_bytes(metadata(**{
            "ARCH.attention.layer_norm_rms_epsilon": 1e38}), tensors()),
         "llama.attention.layer_norm_rms_epsilon is 1e+38, outside"),
        ("a RoPE base of 1e38", gguf_bytes(metadata(**{"ARCH.rope.freq_base": 1e38}), tensors()),
         "llama.rope.freq_base is 1e+38, outside"),
        ("a bos id past the vocabulary", gguf_bytes(metadata(**{
            "tokenizer.ggml.bos_token_id": 10**6}), tensors()),
         "tokenizer.ggml.bos_token_id is 1,000,000, outside the vocabulary"),
        ("an eos id past the vocabulary", gguf_bytes(metadata(**{
            "tokenizer.ggml.eos_token_id": VOCAB}), tensors()), "eos_token_id"),
        ("merges outside the vocabulary", gguf_bytes(metadata(**{
            "tokenizer.ggml.merges": ["zz qq"]}), tensors()), "cannot build its tokenizer"),
    ]


@pytest.mark.parametrize("case, content, says", _header_cases(), ids=lambda v: v
                         if isinstance(v, str) and " " in v else "")
def test_a_damaged_file_is_refused_in_one_line(case, content, says, engine_cli, tmp_path):
    path = write(tmp_path, case.replace(" ", "_"), content)
    refused(engine_cli, ["gguf-info", path], says)
    refused(engine_cli, ["run", "hi", "--model", path, "--max-new-tokens", "1"], says)


@pytest.mark.parametrize("case, content, says", _model_cases(), ids=lambda v: v
                         if isinstance(v, str) and " " in v else "")
def test_a_file_without_a_whole_llama_model_is_refused(case, content, says, engine_cli, tmp_path):
    path = write(tmp_path, case.replace(" ", "_"), content)
    refused(engine_cli, ["run", "hi", "--model", path, "--max-new-tokens", "1"], says)


@pytest.mark.parametrize("args", [["--temperature", "0.7"], ["--decoder", "torch"], []])
def test_nan_weights_stop_the_run_in_one_line(args, engine_cli, tmp_path):
    """Weights that make the logits NaN: sampling would raise deep in torch (a 27-line
    traceback) and greedy would pick token 0 forever; the run stops in one line instead."""
    path = write(tmp_path, "nan", gguf_bytes(metadata(), tensors(), fill={
        "blk.0.ffn_down.weight": float("nan")}))
    refused(engine_cli, ["run", "hi", "--model", path, "--max-new-tokens", "3", *args],
            "NaN or infinite values")


@pytest.mark.parametrize("model", ["/no/such/file.gguf", "~nobody/x.gguf", "a\x01b.gguf"])
def test_a_gguf_path_that_is_no_file_is_refused_in_one_line(model, engine_cli):
    refused(engine_cli, ["run", "hi", "--model", model], "GGUF file not found")


def test_the_tiny_valid_file_opens_and_decodes(engine_cli, tmp_path):
    """The control: the file every case above damages runs, and gguf-info lists its table."""
    path = write(tmp_path, "tiny", VALID)
    done = engine_cli("run", "hi", "--model", path, "--max-new-tokens", "2", "--decoder", "torch",
                      memory_cap=CAP)
    assert done.returncode == 0, done.stderr[-2000:]
    info = engine_cli("gguf-info", path, memory_cap=CAP)
    assert info.returncode == 0 and "blk.1.ffn_down.weight" in info.stdout
    assert "20 tensors" in info.stdout


def test_a_capped_real_process_refuses_a_10_to_the_12_claim(tmp_path):
    """As a fresh `python -m engine` under a 2 GB address-space limit (preexec_fn), not a fork."""
    content = gguf_bytes(metadata(), tensors(), claim={"token_embd.weight": (1_000_000, 1_000_000)})
    path = write(tmp_path, "claim", content)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    done = subprocess.run([sys.executable, "-m", "engine", "gguf-info", path], cwd=ROOT,
                          capture_output=True, text=True, preexec_fn=cap, timeout=120,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "past the end" in done.stderr
