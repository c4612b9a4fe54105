"""Crafting GGUF files byte by byte for the tests: a tiny valid llama (its metadata, its tensor
table, random F32 tensors) that a test can damage anywhere — counts, lengths, shapes — which a
writer such as gguf-py's GGUFWriter would refuse to write.
"""

from __future__ import annotations

import struct

import numpy as np

F32 = 0
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2


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


def metadata(arch: str = "llama", hidden: int = HIDDEN, ffn: int = FFN, **settings) -> dict:
    """The tiny llama's metadata; `settings` replace entries ("ARCH." stands for the
    architecture; None removes one)."""
    values = {"general.architecture": arch, "general.name": "tiny",
              f"{arch}.context_length": 256, f"{arch}.embedding_length": hidden,
              f"{arch}.block_count": LAYERS, f"{arch}.feed_forward_length": ffn,
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


def tensors(drop: str | None = None, hidden: int = HIDDEN, ffn: int = FFN,
            biases: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape in torch order) of the tiny llama, but `drop`; with `biases`, Qwen2's
    q / k / v biases too."""
    kv = KV_HEADS * hidden // HEADS
    block = {"attn_norm.weight": (hidden,), "attn_q.weight": (hidden, hidden),
             "attn_k.weight": (kv, hidden), "attn_v.weight": (kv, hidden),
             "attn_output.weight": (hidden, hidden), "ffn_norm.weight": (hidden,),
             "ffn_gate.weight": (ffn, hidden), "ffn_up.weight": (ffn, hidden),
             "ffn_down.weight": (hidden, ffn)}
    if biases:
        block |= {"attn_q.bias": (hidden,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    found = [("token_embd.weight", (VOCAB, hidden))]
    found += [(f"blk.{i}.{k}", v) for i in range(LAYERS) for k, v in block.items()]
    found.append(("output_norm.weight", (hidden,)))
    return [(n, shape) for n, shape in found if n != drop]


def gguf_bytes(meta: dict, table: list[tuple[str, tuple[int, ...]]], *, magic: bytes = b"GGUF",
               tensor_count: int | None = None, kv_count: int | None = None,
               data: bool = True, claim: dict | None = None, at_zero: bool = False,
               fill: dict | None = None) -> bytes:
    """A GGUF v3 file: the metadata, the tensors as F32 (random, seeded; norms 1), 32-aligned.
    `claim` maps a tensor name to the torch-order shape its header entry states instead of the
    shape its data has; `at_zero`: every tensor's offset 0 (they share the first one's bytes);
    `fill` maps a tensor name to a value every element of it holds (NaN, say)."""
    rng = np.random.default_rng(0)
    infos, blobs, offset = [], [], 0
    for name, shape in table:
        values = np.ones(shape, np.float32) if len(shape) == 1 else \
            rng.normal(0, 0.05, shape).astype(np.float32)
        if name in (fill or {}):
            values = np.full(shape, fill[name], np.float32)
        ne = tuple(reversed((claim or {}).get(name, shape)))
        infos.append(s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
                     + struct.pack("<IQ", F32, 0 if at_zero else offset))
        raw = values.tobytes()
        raw += b"\0" * (-len(raw) % 32)
        blobs.append(raw)
        offset += len(raw)
    head = (magic + struct.pack("<IQQ", 3, len(table) if tensor_count is None else tensor_count,
                                len(meta) if kv_count is None else kv_count)
            + b"".join(kv(k, v) for k, v in meta.items()) + b"".join(infos))
    head += b"\0" * (-len(head) % 32)
    return head + (b"".join(blobs) if data else b"")


