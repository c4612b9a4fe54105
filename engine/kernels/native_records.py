"""Matrices in the native step's stored forms (the layouts native_pack.py describes).

Why a module of its own: the same stored form is reached from two sources — our own quantized
tensors (`quant_blocks`) and GGML's block bytes as a GGUF file holds them (`ggml_stored`) — and
both must land on exactly the same values: a Q4_0 matrix from either source is the same scales
and codes, only moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import EngineError
from ..quant.formats import QuantizedTensor
from .native_formats import BLOCK, GGML_RECORDS, GGML_ROWS

GGML_GROUP = 32  # weights per Q8_0 / Q4_0 / Q4_1 block


@dataclass(frozen=True, slots=True, eq=False)
class GgmlBlocks:
    """One matrix as GGML blocks: what a GGUF file stores for it."""

    type_name: str  # GGML's type name: "Q4_K", "Q6_K", "Q5_0", "Q8_0", "F16", …
    shape: tuple[int, int]  # (out, in) weights
    data: torch.Tensor  # uint8, out · in / block weights · block bytes: the bytes as stored


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) → (ceil(N/B), K, B): each B-row block stored k-major, zero rows as padding."""
    n, k = weight.shape
    if n % BLOCK:
        weight = torch.cat([weight, weight.new_zeros(BLOCK - n % BLOCK, k)])
    return weight.view(-1, BLOCK, k).transpose(1, 2)


def _pad_rows(t: torch.Tensor, value: int = 0) -> torch.Tensor:
    n = t.shape[0]
    if n % BLOCK == 0:
        return t
    return torch.cat([t, t.new_full((BLOCK - n % BLOCK, *t.shape[1:]), value)])


def _records(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor | None, bits: int,
             group: int) -> torch.Tensor:
    """Codes (N, K) in [0, 2^bits) (8-bit stored offset by 128), float16 scales and minimums
    (N, K / group) → (blocks, groups, record) uint8. Padding rows get scale 0 (and minimum 0),
    so they produce 0 whatever their codes."""
    k = codes.shape[1]
    codes = _pad_rows(codes)  # (Np, K)
    blocks = codes.shape[0] // BLOCK
    c = codes.view(blocks, BLOCK, k // group, group).permute(0, 2, 3, 1)  # (nb, G#, g, B)
    if bits == 8:
        code_bytes = (c - 128).to(torch.int8).view(torch.uint8)  # signed: value d·c
    else:
        pairs = c.reshape(blocks, k // group, group // 2, 2, BLOCK)  # k even, k odd
        code_bytes = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).to(torch.uint8)
    records = [code_bytes.reshape(blocks, k // group, -1)]
    for table in (scales, minimums):
        if table is not None:  # (N, G#) float16 → (nb, G#, B) → bytes
            t = _pad_rows(table).view(blocks, BLOCK, k // group).transpose(1, 2).contiguous()
            records.append(t.view(torch.uint8).reshape(blocks, k // group, 2 * BLOCK))
    return torch.cat(records, dim=-1)


def quant_blocks(q: QuantizedTensor) -> torch.Tensor:
    """A quantized (N, K) weight → (blocks, groups, record) uint8 in the layout's record order."""
    return _records(q.unpacked_codes(), q.scales, q.minimums, q.fmt.bits, q.group)


def _halves(b: torch.Tensor) -> torch.Tensor:
    """(…, 2) little-endian float16 bytes → (…) float16."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def ggml_stored(blocks: GgmlBlocks) -> torch.Tensor:
    """GGML blocks in the stored form of their native format: F16 / Q5_0 / Q5_1 / K-quant rows as
    they are (padded with zero rows); F32 as float32 blocks; Q8_0 / Q4_0 / Q4_1 re-laid into
    group records, the same float16 scales and codes (GGML's byte j holds weight j low and
    weight j + 16 high; a record's holds 2i low and 2i + 1 high)."""
    name, (n, k) = blocks.type_name, blocks.shape
    data = blocks.data.reshape(-1)
    if name in GGML_ROWS:
        kind = GGML_ROWS[name]
        row = _pad_rows(data.reshape(n, k // kind.weights * kind.nbytes))
        return row.view(-1, BLOCK, row.shape[1])
    if name not in GGML_RECORDS:
        raise EngineError(f"the native step has no kernel for GGML type {name}")
    if name == "F32":
        return _blocks(data.view(torch.float32).reshape(n, k))
    fmt = GGML_RECORDS[name]
    groups = k // GGML_GROUP
    per = GGML_GROUP * fmt.bits // 8 + fmt.group_bits // 8  # 34, 18, 20 bytes
    b = data.reshape(n, groups, per)
    scales = _halves(b[..., :2])
    minimums = _halves(b[..., 2:4]) if fmt.zero_point else None
    qs = b[..., per - GGML_GROUP * fmt.bits // 8:]
    if fmt.bits == 8:
        codes = qs.view(torch.int8).to(torch.int64) + 128  # (n, G, 32), offset as `_records` reads
    else:
        codes = torch.cat([qs & 15, qs >> 4], -1).to(torch.int64)  # weights j, then j + 16
    return _records(codes.reshape(n, k), scales, minimums, fmt.bits, GGML_GROUP)
