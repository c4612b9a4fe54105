"""Damaged and hostile GGUF files (issue 29.4): each is refused by `python -m engine` with status 2
and one line on stderr — no traceback, no random weights in place of a missing tensor — and with
bounded memory: each case runs with an address-space cap (RLIMIT_AS) 2 GB above what the process
had mapped, so a reader that believed a count of 2^40 or a 10^12-element tensor would die of it
(MemoryError, a traceback) instead of refusing.

The files are crafted here byte by byte (`gguf_bytes`), from a tiny valid llama (2 layers, 64
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

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CAP = 2 << 30  # bytes of address space a case may add
F32 = 0
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS


def _byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (as byte-level BPE vocabularies write them)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_alphabet(), "Ġt"]
VOCAB = len(TOKENS)


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, value) -> bytes:
    """One metadata entry: u32 for int, f32 for float, string, or a list of str / int32."""
    if isinstance(value, bool):
        return s(key) + struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return s(key) + struct.pack("<II", 4, value)
    if isinstance(value, float):
        return s(key) + struct.pack("<If", 6, value)
    if isinstance(value, str):
        return s(key) + struct.pack("<I", 8) + s(value)
    if value and isinstance(value[0], str):
        return s(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(s(v) for v in value)
    return s(key) + struct.pack("<IIQ", 9, 5, len(value)) + struct.pack(f"<{len(value)}i", *value)


def metadata(arch: str = "llama", **settings) -> dict:
    values = {"general.architecture": arch, "general.name": "tiny",
              f"{arch}.context_length": 256, f"{arch}.embedding_length": HIDDEN,
              f"{arch}.block_count": LAYERS, f"{arch}.feed_forward_length": FFN,
              f"{arch}.attention.head_count": HEADS, f"{arch}.attention.head_count_kv": KV_HEADS,
              f"{arch}.rope.freq_base": 10000.0,
              f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
              "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
              "tokenizer.ggml.tokens": TOKENS,
              "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (VOCAB - 3),
              "tokenizer.ggml.merges": ["Ġ t"], "tokenizer.ggml.bos_token_id": 1,
              "tokenizer.ggml.eos_token_id": 2, "tokenizer.chat_template": TEMPLATE}
    values.update({k.replace("ARCH", arch): v for k, v in settings.items()})
    return {k: v for k, v in values.items() if v is not None}


def tensors(drop: str | None = None, **shapes) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape in torch order) of the tiny llama; `shapes` overrides some by name."""
    block = {"attn_norm.weight": (HIDDEN,), "attn_q.weight": (HIDDEN, HIDDEN),
             "attn_k.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
             "attn_v.weight": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output.weight": (HIDDEN, HIDDEN),
             "ffn_norm.weight": (HIDDEN,), "ffn_gate.weight": (FFN, HIDDEN),
             "ffn_up.weight": (FFN, HIDDEN), "ffn_down.weight": (HIDDEN, FFN)}
    found = [("token_embd.weight", (VOCAB, HIDDEN))]
    found += [(f"blk.{i}.{k}", v) for i in range(LAYERS) for k, v in block.items()]
    found.append(("output_norm.weight", (HIDDEN,)))
    return [(n, shapes.get(n.replace(".", "_"), shp)) for n, shp in found if n != drop]


def gguf_bytes(meta: dict, table: list[tuple[str, tuple[int, ...]]], *, magic: bytes = b"GGUF",
               tensor_count: int | None = None, kv_count: int | None = None,
               data: bool = True, claim: dict | None = None) -> bytes:
    """A GGUF v3 file: the metadata, the tensors as F32 (random, seeded; norms 1), 32-aligned.
    `claim` maps a tensor name to the torch-order shape its header entry states instead of the
    shape its data has."""
    rng = np.random.default_rng(0)
    infos, blobs, offset = [], [], 0
    for name, shape in table:
        values = np.ones(shape, np.float32) if len(shape) == 1 else \
            rng.normal(0, 0.05, shape).astype(np.float32)
        ne = tuple(reversed((claim or {}).get(name, shape)))
        infos.append(s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
                     + struct.pack("<IQ", F32, offset))
        raw = values.tobytes()
        raw += b"\0" * (-len(raw) % 32)
        blobs.append(raw)
        offset += len(raw)
    head = (magic + struct.pack("<IQQ", 3, len(table) if tensor_count is None else tensor_count,
                                len(meta) if kv_count is None else kv_count)
            + b"".join(kv(k, v) for k, v in meta.items()) + b"".join(infos))
    head += b"\0" * (-len(head) % 32)
    return head + (b"".join(blobs) if data else b"")


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
