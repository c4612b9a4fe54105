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
from .native_formats import BLOCK, GGML_RECORDS, GGML_ROWS, RELAID

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


def _high_words(bits: torch.Tensor, group: int) -> torch.Tensor:
    """Bit 4 of the codes, (Np, K) of 0 / 1 → (blocks, groups, 4 · group) uint8: per k one
    little-endian uint32 whose bit j is row j's (BLOCK = 32 rows)."""
    blocks, k = bits.shape[0] // BLOCK, bits.shape[1]
    b = bits.view(blocks, BLOCK, k // group, group).permute(0, 2, 3, 1)  # (nb, G#, g, 32)
    b = b.reshape(blocks, k // group, group, 4, 8) << torch.arange(8)
    return b.sum(-1).to(torch.uint8).reshape(blocks, k // group, 4 * group)


def _records(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor | None, bits: int,
             group: int, high: torch.Tensor | None = None) -> torch.Tensor:
    """Codes (N, K) in [0, 2^bits) (8-bit stored offset by 128), scales and minimums (N, K /
    group: float16, or float32 for the re-laid K-quants) and, for Q5_0, each code's bit 4 (N, K)
    → (blocks, groups, record) uint8. Padding rows get scale 0 (and minimum 0), so they produce
    0 whatever their codes."""
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
    if high is not None:
        records.append(_high_words(_pad_rows(high), group))
    for table in (scales, minimums):
        if table is not None:  # (N, G#) → (nb, G#, B) → bytes
            t = _pad_rows(table).view(blocks, BLOCK, k // group).transpose(1, 2).contiguous()
            records.append(t.view(torch.uint8).reshape(blocks, k // group, -1))
    return torch.cat(records, dim=-1)


def quant_blocks(q: QuantizedTensor) -> torch.Tensor:
    """A quantized (N, K) weight → (blocks, groups, record) uint8 in the layout's record order."""
    return _records(q.unpacked_codes(), q.scales, q.minimums, q.fmt.bits, q.group)


def _halves(b: torch.Tensor) -> torch.Tensor:
    """(…, 2) little-endian float16 bytes → (…) float16."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def ggml_stored(blocks: GgmlBlocks) -> torch.Tensor:
    """GGML blocks in the stored form of their native format: F16 / Q5_1 / Q5_K rows as they are
    (padded with zero rows); F32 as float32 blocks; Q8_0 / Q4_0 / Q4_1 re-laid into group
    records, the same float16 scales and codes (GGML's byte j holds weight j low and weight
    j + 16 high; a record's holds 2i low and 2i + 1 high); Q5_0 / Q4_K / Q6_K re-laid into
    group records of their own (`_relaid`)."""
    name, (n, k) = blocks.type_name, blocks.shape
    data = blocks.data.reshape(-1)
    if name in RELAID:
        return _relaid(name, data, n, k)
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


def _relaid(name: str, data: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Q5_0, Q4_K or Q6_K blocks (layouts in native_ggml.h) as group records (native_groups.h)
    holding GGML's values: Q5_0 its float16 d and 5-bit codes (nibbles and a bit-4 plane);
    Q4_K per 32 weights float32 d·sc and dmin·mn with its 4-bit codes; Q6_K per 16 weights
    float32 d·sc with its codes − 32 as int8 — the float32 products gguf-py's dequantize (and
    GGML's) compute, unpacked here as it unpacks them."""
    if name == "Q5_0":
        b = data.reshape(n, k // 32, 22)
        qh = b[..., 2:6].to(torch.int64)  # (n, G, 4): bit j of the little-endian word = weight j
        high = (qh.unsqueeze(-1) >> torch.arange(8)) & 1  # (n, G, 4, 8)
        qs = b[..., 6:].to(torch.int64)
        codes = torch.cat([qs & 15, qs >> 4], -1)  # weights j, then j + 16
        return _records(codes.reshape(n, k), _halves(b[..., :2]), None, 4, 32,
                        high.reshape(n, k))
    if name == "Q4_K":
        b = data.reshape(n, k // 256, 144)
        d, dmin = _halves(b[..., 0:2]).float(), _halves(b[..., 2:4]).float()  # (n, S)
        q = b[..., 4:16].to(torch.int64).reshape(n, -1, 3, 4)
        lo, mid, top = q[..., 0, :], q[..., 1, :], q[..., 2, :]
        sc = torch.cat([lo & 63, (top & 15) | ((lo >> 2) & 48)], -1)  # (n, S, 8)
        mn = torch.cat([mid & 63, (top >> 4) | ((mid >> 2) & 48)], -1)
        qs = b[..., 16:].to(torch.int64).reshape(n, -1, 4, 1, 32) >> torch.tensor([0, 4]).view(2, 1)
        codes = (qs & 15).reshape(n, k)  # sub-block 2c low nibbles of chunk c, 2c + 1 high
        scales = (d.unsqueeze(-1) * sc.float()).reshape(n, -1)
        minimums = (dmin.unsqueeze(-1) * mn.float()).reshape(n, -1)
        return _records(codes, scales, minimums, 4, 32)
    b = data.reshape(n, k // 256, 210)  # Q6_K: ql[128], qh[64], int8 scales[16], d
    d = _halves(b[..., 208:210]).float()
    scales = (d.unsqueeze(-1) * b[..., 192:208].view(torch.int8).float()).reshape(n, -1)
    ql = b[..., :128].to(torch.int64).reshape(n, -1, 2, 1, 64) >> torch.tensor([0, 4]).view(2, 1)
    qh = b[..., 128:192].to(torch.int64).reshape(n, -1, 2, 1, 32) >> torch.tensor(
        [0, 2, 4, 6]).view(4, 1)
    codes = (ql & 15).reshape(n, -1, 2, 4, 32) | ((qh & 3) << 4)  # (n, S, half, quarter, 32)
    return _records(codes.reshape(n, k) + 96, scales, None, 8, 16)  # stored c − 128 = q − 32
