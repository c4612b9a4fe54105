"""Our quantized weights as GGML's block bytes: the form in which "q4_0 is GGML's Q4_0" is checked.

A GGML row of `in` weights is in / 32 blocks, each block its float16 scale (Q4_1: then its
float16 minimum) followed by its 32 codes: Q8_0 as 32 int8 (value d·c); Q4_0 and Q4_1 as 16
bytes, byte j holding weight j in the low nibble and weight j + 16 in the high one (Q4_0 value
d·(c − 8), Q4_1 value d·c + m). Our `QuantizedTensor` keeps the same scales and codes in its own
packing (two consecutive weights per byte, scales in a separate tensor, the native step's records
re-laid per 32 rows); `ggml_blocks` re-lays them into GGML's bytes, so they can be compared with
gguf-py's quantizer (`gguf.quants.quantize`) byte for byte, and written to a GGUF file as they are.
"""

from __future__ import annotations

import torch

from .formats import QuantizedTensor
from .scheme import FORMATS, QuantFormat

GGML_BLOCK = 32  # weights per GGML block (QK4_0 = QK4_1 = QK8_0 = 32)

# Our format name → GGML's type name, for the formats that are GGML's bit for bit.
GGML_NAMES: dict[str, str] = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q8_0": "Q8_0"}


def ggml_type(fmt: QuantFormat) -> str:
    """GGML's name for `fmt` ("Q4_0", "Q4_1", "Q8_0"); ValueError for a format of our own (other
    bits or groups, or one row per scale), which has no GGML blocks."""
    name = GGML_NAMES.get(fmt.name)
    if name is None or fmt != FORMATS[fmt.name]:
        raise ValueError(f"{fmt.name} is not a GGML format ({', '.join(GGML_NAMES)} are)")
    return name


def block_bytes(fmt: QuantFormat) -> int:
    """Bytes of one GGML block of `fmt`: 18 (Q4_0), 20 (Q4_1), 34 (Q8_0)."""
    ggml_type(fmt)
    return GGML_BLOCK * fmt.bits // 8 + fmt.group_bits // 8


def ggml_blocks(q: QuantizedTensor) -> torch.Tensor:
    """(out, in / 32 · block bytes) uint8: `q`'s scales, minimums and codes in GGML's block
    layout, row by row — what `gguf.quants.quantize(weight, type)` returns for the same weight."""
    ggml_type(q.fmt)
    out, inn = q.shape
    groups = inn // GGML_BLOCK
    codes = q.unpacked_codes().reshape(out, groups, GGML_BLOCK)  # (out, G, 32) in [0, 2^bits)
    if q.fmt.bits == 8:  # stored offset by 128; GGML keeps the signed int8
        code_bytes = (codes - 128).to(torch.int8).view(torch.uint8)  # (out, G, 32)
    else:  # byte j: weight j low, weight j + 16 high
        code_bytes = (codes[..., :16] | (codes[..., 16:] << 4)).to(torch.uint8)  # (out, G, 16)
    parts = [q.scales.contiguous().view(torch.uint8).reshape(out, groups, 2)]  # little-endian
    if q.minimums is not None:
        parts.append(q.minimums.contiguous().view(torch.uint8).reshape(out, groups, 2))
    parts.append(code_bytes)
    return torch.cat(parts, dim=-1).reshape(out, groups * block_bytes(q.fmt))
