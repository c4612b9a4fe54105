"""GGML's K-quants Q4_K and Q6_K, and Q5_0 and Q8_0 (their fallbacks), as GGML's block bytes.

Why a module of its own: a K-quant block is a 256-weight super-block whose per-32 (Q4_K) or
per-16 (Q6_K) scales are themselves quantized against one float16 scale, and its codes are chosen
by a small search (`make_qkx2_quants`, `make_qx_quants` in ggml-quants.c), not by one rounding as
in `formats`. The bytes are what llama.cpp writes, so the stored form here is the block tensor
itself (uint8, one row of blocks per weight row) and "bytes" is its `nbytes`.

Layouts (gguf-py's `gguf.quants` reads them; its `dequantize` is the reference the tests compare
with bit for bit):
- Q4_K, 144 bytes per 256 weights: f16 d, f16 dmin, 12 bytes of eight 6-bit scales and eight
  6-bit mins, 128 bytes of 4-bit codes; value (d · sc) · q − dmin · m;
- Q6_K, 210 bytes per 256: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per
  16 weights), f16 d; value (d · sc) · (q − 32);
- Q5_0, 22 bytes per 32: f16 d, 4 bytes of fifth bits, 16 bytes of low nibbles; d · (q − 16);
- Q8_0, 34 bytes per 32: f16 d, 32 int8 codes (`formats` + `ggml_blocks`).

The quantizers follow `quantize_row_q4_K_ref` and `quantize_row_q6_K_ref` (what llama-quantize
runs without an importance matrix) operation for operation in float32, vectorised over blocks:
each loop of the C code over the weights of a block becomes a loop over the block's positions
(`_seq_sum`), so every float32 sum is added in the C code's order. nearest_int(x) (x + 1.5·2^23,
mantissa bits) is round half to even, `np.round`. C compilers may contract a·b + c into one
FMA where the target has it (aarch64; x86-64 only with -march flags): the codes here are those of
a build without contraction. Checked once (issue 29) against those two C functions and their
helpers copied from ggml-quants.c and built with gcc -O2 -ffp-contract=off: all 829,440
super-blocks of the default model's 210 decoder weights, as Q4_K and as Q6_K, byte for byte
(gguf-py has no K-quant quantizer to test against; tests/test_quant_kquants.py checks what it
can: dequantization bit for bit, the layouts by hand, the error bounds). Q5_0 is gguf-py's own
quantizer, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .formats import quantize
from .ggml_blocks import ggml_blocks
from .scheme import FORMATS

QK_K = 256  # weights per K-quant super-block
GROUP_MAX_EPS = 1e-15  # ggml-quants.c: a group whose largest |w| is below this is all zero

# GGML type → (weights per block, bytes per block, bytes of codes per block: the rest is scales)
BLOCKS: dict[str, tuple[int, int, int]] = {
    "Q4_K": (QK_K, 144, 128), "Q6_K": (QK_K, 210, 192),
    "Q5_0": (32, 22, 20), "Q8_0": (32, 34, 32), "F16": (1, 2, 2),
}
# llama-quant.cpp's tensor_type_fallback, for rows that are not a whole number of blocks
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


def _f32(*terms: float | tuple[float, float]) -> np.float32:
    """Σ of the terms (products given as pairs) in float32, left to right, as C's float
    arithmetic computes a constant like `rmin + rdelta*is + nmax`."""
    acc = np.float32(0)
    for t in terms:
        acc = acc + (np.float32(t[0]) * np.float32(t[1]) if isinstance(t, tuple) else np.float32(t))
    return acc


def _seq_sum(t: np.ndarray, from_first: bool = False) -> np.ndarray:
    """(n, …) → (…) summed over dim 0 left to right from 0.0f, as `float s = 0; s += t[i]` in C
    (a library sum adds in another order, whose float32 result can differ in the last bit);
    `from_first`: `float s = t[0]` then the rest (0.0f + −0.0f would lose a sign). The groups
    lie along the last dims so each step is one contiguous vector op over every group."""
    acc = t[0].copy() if from_first else np.zeros_like(t[0])
    for row in t[1:] if from_first else t:
        acc += row
    return acc


def _nearest(x: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even (x is float32)."""
    return np.round(x)


# The two searches run in numpy: thousands of small float32 vector ops, which torch splits
# across its threads (on a busy 2-core machine that made them 20× slower); numpy's float32
# arithmetic, sqrt and round-half-even are IEEE's, as C's.
ZERO = np.float32(0)


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes L (G, n) in [0, nmax], scale (G,) and min (G,) ≥ 0 for groups x (G, n) float32 with
    weights w: value ≈ scale · L − min. The grid starts at min(x, 0) and spans the group; then
    nstep + 1 stretched grids are tried, each refitted by weighted least squares, and the one of
    least weighted squared error kept (use_mad = false, as Q4_K calls it)."""
    x, w = np.ascontiguousarray(x.T), np.ascontiguousarray(w.T)  # (n, G), see `_seq_sum`
    lo = np.minimum(x.min(0), ZERO)  # (G,) the C code's `min`, clamped to ≤ 0
    hi = x.max(0)
    flat = hi == lo
    sum_w, sum_x = _seq_sum(np.stack([w, w * x], 1), from_first=True)  # both from element 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.float32(nmax) / np.where(flat, np.float32(1), hi - lo)
        scale = np.float32(1) / iscale
        L = np.clip(_nearest(iscale * (x - lo)), 0, nmax)
        diff = scale * L + lo - x
        best = _seq_sum(w * (diff * diff))
        for step in range(nstep + 1):
            iscale = _f32(rmin, (rdelta, step), nmax) / (hi - lo)
            la = np.clip(_nearest(iscale * (x - lo)), 0, nmax)  # (n, G) Laux
            wl = w * la
            sum_l, sum_l2, sum_xl = _seq_sum(np.stack([wl, wl * la, wl * x], 1))
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            this_min = np.where(pos, ZERO, this_min)
            diff = this_scale * la + this_min - x
            err = _seq_sum(w * (diff * diff))
            take = (D > 0) & (err < best) & ~flat
            L = np.where(take, la, L)
            best = np.where(take, err, best)
            scale = np.where(take, this_scale, scale)
            lo = np.where(take, this_min, lo)
    return np.where(flat, ZERO, L).T, np.where(flat, ZERO, scale), -lo


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes L (G, n) in [0, 2·nmax) (stored offset by nmax) and scale (G,) for groups x (G, n)
    float32, value ≈ scale · (L − nmax); rmse_type 1 (weights x²), as Q6_K calls it. The first
    weight of largest |x| sets a grid that maps it to −nmax; 18 grids stretched by ±0.1·k levels
    are tried and the one of largest (Σ w·x·l)² / Σ w·l² (least weighted squared error) kept."""
    peak = np.take_along_axis(x, np.abs(x).argmax(-1)[:, None], -1)[:, 0]  # (G,) first of max |x|
    zero = np.abs(x).max(-1) < GROUP_MAX_EPS
    peak = np.where(zero, np.float32(1), peak)
    x = np.ascontiguousarray(x.T)  # (n, G), see `_seq_sum`
    wx, ww = x * x * x, x * x  # C's w·x[i] and w with w = x²

    def codes(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = np.clip(_nearest(iscale * x), -nmax, nmax - 1)
        sumlx, suml2 = _seq_sum(np.stack([wx * q, ww * q * q], 1))
        return q, sumlx, suml2

    q, sumlx, suml2 = codes(np.float32(-nmax) / peak)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, ZERO)
        best = scale * sumlx
        for step in (*range(-9, 0), *range(1, 10)):
            la, slx, sl2 = codes(-_f32(nmax, (0.1, step)) / peak)
            take = (sl2 > 0) & (slx * slx > best * sl2)
            q = np.where(take, la, q)
            scale = np.where(take, slx / sl2, scale)
            best = np.where(take, scale * slx, best)
    return np.where(zero, ZERO, q + nmax).T, np.where(zero, ZERO, scale)


def _positive_max(v: np.ndarray) -> np.ndarray:
    """C's `float m = 0; if (v[j] > m) m = v[j];` over the last dim: +0.0 unless some v > 0 (a
    group's min is −0.0 when the group is all zero; a max and a clamp would keep that sign)."""
    top = v.max(-1)
    return np.where(top > 0, top, ZERO)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """(B,) float32 → (B, 2) uint8: GGML_FP32_TO_FP16 (round to nearest even), little-endian."""
    return v.astype("<f2").view(np.uint8).reshape(-1, 2)


def _q4_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref on super-blocks x (B, 256) float32 → (B, 144) uint8."""
    B = x.shape[0]
    sub = x.reshape(B * 8, 32)  # (B·8, 32) the eight 32-weight sub-blocks
    av_x = np.sqrt(_seq_sum((sub * sub).T) / np.float32(32))  # (B·8,)
    L, scales, mins = make_qkx2_quants(sub, av_x[:, None] + np.abs(sub), 15, -1.0, 0.1, 20)
    scales, mins = scales.reshape(B, 8), mins.reshape(B, 8)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)  # (B,)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, np.float32(63) / max_scale, ZERO)
        inv_min = np.where(max_min > 0, np.float32(63) / max_min, ZERO)
    # uint8 ls = nearest_int(...): a C int → uint8 conversion keeps the low 8 bits
    ls = np.minimum(_nearest(inv_scale[:, None] * scales).astype(np.int64) & 0xFF, 63)  # (B, 8)
    lm = np.minimum(_nearest(inv_min[:, None] * mins).astype(np.int64) & 0xFF, 63)
    d16 = (max_scale / np.float32(63)).astype(np.float16)
    dmin16 = (max_min / np.float32(63)).astype(np.float16)
    d = d16.astype(np.float32)[:, None] * ls.astype(np.float32)  # (B, 8) FP16_TO_FP32(d) * sc
    dm = dmin16.astype(np.float32)[:, None] * lm.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(_nearest((sub.reshape(B, 8, 32) + dm[..., None]) / d[..., None]), 0, 15)
    L = np.where((d != 0)[..., None], again, L.reshape(B, 8, 32)).astype(np.uint8)
    L = L.reshape(B, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(B, 128)  # 64 weights per 32 bytes
    packed = np.concatenate([ls[:, :4] | ((ls[:, 4:] >> 4) << 6), lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
                             (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)], -1).astype(np.uint8)
    return np.concatenate([_f16_bytes(d16), _f16_bytes(dmin16), packed, qs], -1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref on super-blocks x (B, 256) float32 → (B, 210) uint8."""
    B = x.shape[0]
    L, scales = make_qx_quants(x.reshape(B * 16, 16), 32)  # 16 sub-blocks of 16
    scales, L = scales.reshape(B, 16), L.reshape(B, 16, 16)
    max_scale = np.take_along_axis(scales, np.abs(scales).argmax(-1)[:, None], -1)[:, 0]
    zero = np.abs(max_scale) < GROUP_MAX_EPS  # (B,) max_scale: the first of largest |scale|
    iscale = np.float32(-128) / np.where(zero, np.float32(1), max_scale)
    d16 = (np.float32(1) / iscale).astype(np.float16)
    sc = np.minimum(_nearest(iscale[:, None] * scales), 127)  # (B, 16) int8 values
    d = d16.astype(np.float32)[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(_nearest(x.reshape(B, 16, 16) / d[..., None]), -32, 31) + 32
    L = np.where((d != 0)[..., None], again, L).astype(np.uint8).reshape(B, 2, 4, 32)
    ql = np.concatenate([L[:, :, 0] & 0xF | ((L[:, :, 2] & 0xF) << 4),
                         L[:, :, 1] & 0xF | ((L[:, :, 3] & 0xF) << 4)], -1)  # (B, 2, 64)
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)
    blocks = np.concatenate([ql.reshape(B, 128), qh.reshape(B, 64),
                             sc.astype(np.int8).view(np.uint8), _f16_bytes(d16)], -1)
    blocks[zero] = 0
    return blocks


def _q5_0(x: np.ndarray) -> np.ndarray:
    """gguf-py's Q5_0 quantizer (= quantize_row_q5_0_ref) on blocks x (B, 32) → (B, 22) uint8."""
    peak = np.take_along_axis(x, np.abs(x).argmax(-1)[:, None], -1)  # (B, 1) first of max |x|
    d = peak / np.float32(-16)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, ZERO, np.float32(1) / d)
    q = np.clip(np.trunc(x * inv + np.float32(16.5)), 0, 31).astype(np.uint8)  # (B, 32)
    qs = (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)
    qh = np.packbits(q >> 4, axis=-1, bitorder="little")  # (B, 4): bit j, weight j's fifth bit
    return np.concatenate([_f16_bytes(d[:, 0]), qh, qs], -1)


def check_type(ggml_type: str, in_features: int) -> tuple[int, int, int]:
    """(block, bytes, code bytes) of `ggml_type`; ValueError when rows of `in_features` weights
    are not whole blocks (a row needing llama.cpp's fallback, `stored_type`)."""
    if ggml_type not in BLOCKS:
        raise ValueError(f"{ggml_type} is not one of {', '.join(BLOCKS)}")
    block = BLOCKS[ggml_type]
    if in_features % block[0]:
        raise ValueError(f"rows of {in_features} weights are not whole {ggml_type} blocks of "
                         f"{block[0]}: llama.cpp stores them as {stored_type(ggml_type, in_features)}")
    return block


@torch.no_grad()
def quantize_blocks(weight: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """`weight` (out, in) → (out, in / block · block bytes) uint8: GGML's blocks of `ggml_type`
    ("Q4_K", "Q6_K", "Q5_0", "Q8_0", "F16"), row by row, as a GGUF file stores them. Raises
    ValueError for a row that is not whole blocks: a Q4_K tensor of 576 columns is never silently
    written as something else (pick the type with `stored_type`)."""
    if weight.dim() != 2:
        raise ValueError(f"a weight matrix is 2-D (out, in), not {tuple(weight.shape)}")
    out, inn = weight.shape
    block, nbytes, _ = check_type(ggml_type, inn)
    w = weight.detach().float().cpu().contiguous()  # the blocks are built on the CPU
    if ggml_type == "F16":
        return w.half().view(torch.uint8).reshape(out, inn * 2)
    if ggml_type == "Q8_0":
        return ggml_blocks(quantize(w, FORMATS["q8_0"]))
    fn = {"Q4_K": _q4_k, "Q6_K": _q6_k, "Q5_0": _q5_0}[ggml_type]
    blocks = fn(w.numpy().reshape(-1, block))  # (B, bytes)
    return torch.from_numpy(blocks).reshape(out, inn // block * nbytes)


def _half(b: torch.Tensor) -> torch.Tensor:
    """(…, 2) uint8 little-endian float16 bytes → (…, 1) float32."""
    return b.contiguous().view(torch.float16).float()


@torch.no_grad()
def dequantize_blocks(blocks: torch.Tensor, ggml_type: str, shape: tuple[int, int]) -> torch.Tensor:
    """GGML blocks (out, in / block · bytes) uint8 → (out, in) float32, computed as gguf-py's
    `dequantize` (and ggml's dequantize_row_*) compute them, so the float32 bits are theirs."""
    out, inn = shape
    block, nbytes, _ = check_type(ggml_type, inn)
    b = blocks.reshape(-1, nbytes)  # (B, bytes)
    B = b.shape[0]
    if ggml_type == "F16":
        return b.contiguous().view(torch.float16).float().reshape(out, inn)
    if ggml_type == "Q8_0":
        v = _half(b[:, :2]) * b[:, 2:].view(torch.int8).float()
    elif ggml_type == "Q5_0":
        qh = b[:, 2:6].to(torch.int64)
        bit = torch.arange(8, device=b.device).repeat(4)
        high = (qh.repeat_interleave(8, -1) >> bit) & 1  # (B, 32)
        low = torch.cat([b[:, 6:] & 0xF, b[:, 6:] >> 4], -1).to(torch.int64)
        v = _half(b[:, :2]) * ((low | (high << 4)) - 16).float()
    elif ggml_type == "Q4_K":
        s = b[:, 4:16].to(torch.int64)
        sc = torch.cat([s[:, :4] & 63, (s[:, 8:] & 0xF) | ((s[:, :4] >> 6) << 4)], -1)  # (B, 8)
        m = torch.cat([s[:, 4:8] & 63, (s[:, 8:] >> 4) | ((s[:, 4:8] >> 6) << 4)], -1)
        d = (_half(b[:, :2]) * sc.float())[..., None]  # (B, 8, 1)
        dm = (_half(b[:, 2:4]) * m.float())[..., None]
        qs = b[:, 16:].reshape(B, 4, 1, 32)
        q = torch.cat([qs & 0xF, qs >> 4], 2).reshape(B, 8, 32).float()
        v = d * q - dm
    else:  # Q6_K
        ql = b[:, :128].reshape(B, 2, 1, 64)
        ql = torch.cat([ql & 0xF, ql >> 4], 2).reshape(B, 2, 4, 32)  # (B, half, quarter, 32)
        shift = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device)[:, None]
        qh = b[:, 128:192].reshape(B, 2, 1, 32) >> shift
        q = ((ql | ((qh & 3) << 4)).to(torch.int64) - 32).reshape(B, 16, 16).float()
        d = _half(b[:, 208:210]) * b[:, 192:208].view(torch.int8).float()  # (B, 16)
        v = d[..., None] * q
    return v.reshape(out, inn)


def stored_type(ggml_type: str, in_features: int) -> str:
    """The type llama.cpp actually stores a tensor of `in_features` columns in when asked for
    `ggml_type` (llama-quant.cpp's tensor_type_fallback): Q4_K → Q5_0 and Q6_K → Q8_0 when the
    row is not whole 256-blocks, then F16 when it is not whole 32-blocks either."""
    if in_features % BLOCKS[ggml_type][0] == 0:
        return ggml_type
    fallback = FALLBACK.get(ggml_type)
    if fallback is None:
        raise ValueError(f"llama.cpp defines no fallback for {ggml_type}")
    return fallback if in_features % BLOCKS[fallback][0] == 0 else "F16"


@dataclass(frozen=True, slots=True, eq=False)
class StoredBlocks:
    """One weight as GGML blocks: what a GGUF file holds for it, and what a kernel reads."""

    ggml_type: str
    shape: tuple[int, int]  # (out, in) of the weight
    blocks: torch.Tensor  # (out, in / block · block bytes) uint8

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    @property
    def code_bytes(self) -> int:
        """The blocks' code bytes (the rest of each block is its scales)."""
        block, nbytes, codes = BLOCKS[self.ggml_type]
        return self.blocks.nbytes // nbytes * codes

    @property
    def group_bytes(self) -> int:
        return self.nbytes - self.code_bytes

    def dequantize(self) -> torch.Tensor:
        return dequantize_blocks(self.blocks, self.ggml_type, self.shape)


def store_blocks(weight: torch.Tensor, ggml_type: str) -> StoredBlocks:
    """`weight` (out, in) as GGML blocks of `ggml_type` (no fallback: see `stored_type`)."""
    return StoredBlocks(ggml_type, tuple(weight.shape), quantize_blocks(weight, ggml_type))


def bits_per_weight(ggml_type: str) -> float:
    """Stored bits per weight: 4.5 (Q4_K), 6.5625 (Q6_K), 5.5 (Q5_0), 8.5 (Q8_0), 16 (F16)."""
    block, nbytes, _ = BLOCKS[ggml_type]
    return nbytes * 8 / block


def code_bits(ggml_type: str) -> int:
    """Bits of one weight's code: 4, 6, 5, 8 (16 for F16)."""
    block, _, codes = BLOCKS[ggml_type]
    return codes * 8 // block
