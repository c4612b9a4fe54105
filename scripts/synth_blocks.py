"""Random GGML blocks with a chosen weight spread, generated directly as the bytes a GGUF stores.

Why not quantize random float weights: llama-quantize's search is slow in Python (an 8B file
would take many minutes) and the synthetic files only need weights of the right type, layout and
size with a sane scale. So each block is random bytes (uniform codes) with its scale fields
written over them: a float16 `d` per block (varying ±10 % around the value that gives the wanted
standard deviation), fixed sub-block scales for the K-quants. Layouts as ggml-common.h and
gguf-py's `gguf.quants` define them:

| type | bytes | layout | value |
|---|---|---|---|
| Q4_0 | 18 / 32 | f16 d, 16 bytes of nibbles | d · (q − 8), q in 0..15 |
| Q5_0 | 22 / 32 | f16 d, 4 bytes of 5th bits, 16 bytes of nibbles | d · (q − 16), q in 0..31 |
| Q8_0 | 34 / 32 | f16 d, 32 int8 | d · q |
| Q4_K | 144 / 256 | f16 d, f16 dmin, 12 bytes of 6-bit scales / mins, 128 of nibbles | d·sc·q − dmin·m |
| Q6_K | 210 / 256 | 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, f16 d | d · sc · (q − 32) |

Uniform codes have a known spread: q uniform on 0..n−1 has standard deviation
sqrt((n² − 1) / 12), so d = std / (sub-block scale · that).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

# GGML type → (weights per block, bytes per block)
BLOCK = {"F32": (1, 4), "F16": (1, 2), "Q4_0": (32, 18), "Q5_0": (32, 22), "Q8_0": (32, 34),
         "Q4_K": (256, 144), "Q6_K": (256, 210)}
CHUNK_BYTES = 1 << 25  # rows are generated and written in pieces of about this size

# Q4_K: every sub-block scale and min 32 (the 6-bit fields packed as get_scale_min_k4 reads them:
# bytes 0-3 scales, 4-7 mins, each with the high 2 bits of sub-blocks 4-7 in bits 6-7; bytes
# 8-11 the low 4 bits of sub-blocks 4-7), dmin = 7.5 d so the values centre on zero
_Q4K_SUB = 32
_Q4K_SCALES = np.array([_Q4K_SUB | (_Q4K_SUB >> 4) << 6] * 8 + [0] * 4, dtype=np.uint8)
_Q6K_SUB = 8  # every Q6_K sub-block scale


def _spread(levels: int) -> float:
    """Standard deviation of a code uniform on `levels` values."""
    return float(np.sqrt((levels * levels - 1) / 12))


# GGML type → the d that gives weights of standard deviation 1
_UNIT_D = {"Q4_0": 1 / _spread(16), "Q5_0": 1 / _spread(32), "Q8_0": 1 / _spread(256),
           "Q4_K": 1 / (_Q4K_SUB * _spread(16)), "Q6_K": 1 / (_Q6K_SUB * _spread(64))}


def row_bytes(ggml_type: str, cols: int) -> int:
    """Bytes one row of `cols` weights takes; ValueError when the row is not whole blocks."""
    per_block, nbytes = BLOCK[ggml_type]
    if cols % per_block:
        raise ValueError(f"rows of {cols} weights are not whole {ggml_type} blocks of {per_block}")
    return cols // per_block * nbytes


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    words = rng.bit_generator.random_raw((n + 7) // 8)
    return words.view(np.uint8)[:n]


def _scales(rng: np.random.Generator, n: int, d: float) -> np.ndarray:
    """n float16 block scales around d (±10 %), as bytes (n, 2)."""
    jitter = rng.random(n, dtype=np.float32) * np.float32(0.2) + np.float32(0.9)
    return (jitter * np.float32(d)).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng: np.random.Generator, ggml_type: str, rows: int, cols: int,
                  std: float) -> np.ndarray:
    """(rows, row bytes) uint8: `rows` rows of random `ggml_type` blocks whose weights have
    standard deviation about `std` and mean about zero."""
    nbytes = row_bytes(ggml_type, cols)
    if ggml_type in ("F32", "F16"):
        values = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)
        return values.astype(np.float32 if ggml_type == "F32" else np.float16).view(np.uint8)
    out = _random_bytes(rng, rows * nbytes).reshape(-1, BLOCK[ggml_type][1])
    d = std * _UNIT_D[ggml_type]
    if ggml_type == "Q4_K":
        scales = _scales(rng, len(out), d)
        out[:, 0:2] = scales
        dmin = scales.view(np.float16).astype(np.float32) * np.float32(7.5)
        out[:, 2:4] = dmin.astype(np.float16).view(np.uint8).reshape(-1, 2)
        out[:, 4:16] = _Q4K_SCALES
    elif ggml_type == "Q6_K":
        out[:, 192:208] = _Q6K_SUB
        out[:, 208:210] = _scales(rng, len(out), d)
    else:  # Q4_0, Q5_0, Q8_0: d first, codes after
        out[:, 0:2] = _scales(rng, len(out), d)
    return out.reshape(rows, nbytes)


def row_chunks(rows: int, nbytes_per_row: int) -> Iterator[tuple[int, int]]:
    """(first row, row count) pieces of about CHUNK_BYTES, so a tensor is never whole in memory."""
    step = max(1, CHUNK_BYTES // max(1, nbytes_per_row))
    for first in range(0, rows, step):
        yield first, min(step, rows - first)
