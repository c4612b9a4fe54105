"""Round-to-nearest weight quantizers whose stored form is real tensors, so that "bytes" is
what the tensors hold (`nbytes`), not what a formula says they should.

A weight W of shape (out, in) is split into groups along `in` (see `scheme`); each group keeps a
float16 scale (and, with a zero point, a float16 minimum) and one code per weight, packed into
uint8 bytes. `dequantize()` rebuilds float32 values in the order GGUF readers use
(d · c + m), so a weight that came from a Q4_1 file is rebuilt bit for bit (see `gguf_grid`).

What round to nearest promises (and `error_bound` computes per group): a weight inside the
grid's range is at most half a step from a grid point, |w − deq(q(w))| ≤ d̂/2, where d̂ is the
*stored* (float16) scale. Rounding the scale and minimum to float16 can leave the group's extreme
weights slightly outside the grid's range; those are off by the overhang instead, so the exact
bound is max(d̂/2, overhang), plus a few float32 roundings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .scheme import QuantFormat

_FP32_SLACK = 2.0 ** -21  # 8 float32 ulps (2^-24 each) of the group's magnitude


def _nearest(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest integer: the rounding the error bound relies on (tests replace it
    with floor to show the bound then fails)."""
    return torch.round(x)


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedTensor:
    """One quantized weight as stored: packed codes, float16 scales, float16 minimums."""

    fmt: QuantFormat
    shape: tuple[int, int]  # (out, in) of the original weight
    codes: torch.Tensor  # (out, in · bits / 8) uint8, codes packed along each row
    scales: torch.Tensor  # (out, in / group) float16
    minimums: torch.Tensor | None  # (out, in / group) float16 with a zero point, else None

    @property
    def code_bytes(self) -> int:
        return self.codes.nbytes

    @property
    def group_bytes(self) -> int:
        """Scales and minimums, as stored."""
        return self.scales.nbytes + (self.minimums.nbytes if self.minimums is not None else 0)

    @property
    def nbytes(self) -> int:
        return self.code_bytes + self.group_bytes

    @property
    def group(self) -> int:
        return self.fmt.group_for(self.shape[1])

    def unpacked_codes(self) -> torch.Tensor:
        """(out, in) int64 codes in [0, 2^bits − 1] (symmetric codes are stored offset by
        2^(bits−1), so −8..7 is stored as 0..15 for 4 bits)."""
        return unpack_codes(self.codes, self.fmt.bits, self.shape[1])

    def dequantize(self) -> torch.Tensor:
        """(out, in) float32: d · c + m per group (symmetric: d · (c − 2^(bits−1)))."""
        out, inn = self.shape
        g = self.group
        c = self.unpacked_codes().reshape(out, inn // g, g).float()  # (out, G, g)
        d = self.scales.float().unsqueeze(-1)  # (out, G, 1)
        if self.minimums is None:
            w = d * (c - 2 ** (self.fmt.bits - 1))
        else:
            w = d * c + self.minimums.float().unsqueeze(-1)
        return w.reshape(out, inn)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(out, in) codes in [0, 2^bits) → (out, in · bits / 8) uint8. Each run of lcm(bits, 8) /
    bits codes becomes one little-endian word of lcm(bits, 8) ≤ 24 bits, written as bytes."""
    out, inn = codes.shape
    if bits == 8:
        return codes.to(torch.uint8)
    per_word = _lcm8(bits) // bits
    nbytes = _lcm8(bits) // 8
    v = codes.to(torch.int64).reshape(out, inn // per_word, per_word)  # (out, W, per_word)
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    word = (v << shifts).sum(-1)  # (out, W): disjoint bit fields, so the sum is an OR
    parts = [(word >> (8 * j)) & 0xFF for j in range(nbytes)]
    return torch.stack(parts, -1).reshape(out, -1).to(torch.uint8)  # (out, W · nbytes)


def unpack_codes(packed: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """The inverse of `pack_codes`: (out, in · bits / 8) uint8 → (out, in) int64."""
    out = packed.shape[0]
    if bits == 8:
        return packed.to(torch.int64)
    per_word = _lcm8(bits) // bits
    nbytes = _lcm8(bits) // 8
    b = packed.to(torch.int64).reshape(out, in_features // per_word, nbytes)  # (out, W, nbytes)
    word = (b << (torch.arange(nbytes, dtype=torch.int64) * 8)).sum(-1)  # (out, W)
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    codes = (word.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # (out, W, per_word)
    return codes.reshape(out, in_features)


def _lcm8(bits: int) -> int:
    return math.lcm(bits, 8)


def _scale16(d: torch.Tensor, what: str) -> torch.Tensor:
    d16 = d.to(torch.float16)
    if not torch.isfinite(d16).all():
        raise ValueError(f"a group's {what} does not fit a float16 (weights beyond ±65504)")
    return d16


@torch.no_grad()
def quantize(weight: torch.Tensor, fmt: QuantFormat) -> QuantizedTensor:
    """Round `weight` (out, in) to nearest on `fmt`'s per-group grid; scales from each group's
    own range (max |w| symmetric, min and max with a zero point), rounded to float16 before the
    codes are chosen, so the codes fit the scales actually stored."""
    if weight.dim() != 2:
        raise ValueError(f"a weight matrix is 2-D (out, in), not {tuple(weight.shape)}")
    out, inn = weight.shape
    fmt.check_shape(out, inn)
    g = fmt.group_for(inn)
    x = weight.detach().float().reshape(out, inn // g, g)  # (out, G, g)
    if fmt.zero_point:
        top = 2 ** fmt.bits - 1
        lo, hi = x.amin(-1), x.amax(-1)  # (out, G)
        d16, m16 = _scale16((hi - lo) / top, "scale"), _scale16(lo, "minimum")
        d, m = d16.float().unsqueeze(-1), m16.float().unsqueeze(-1)  # (out, G, 1)
        t = torch.where(d > 0, (x - m) / torch.where(d > 0, d, 1.0), 0.0)
        codes = _nearest(t).clamp(0, top)
    else:
        half = 2 ** (fmt.bits - 1)
        d16, m16 = _scale16(x.abs().amax(-1) / (half - 1), "scale"), None
        d = d16.float().unsqueeze(-1)
        t = torch.where(d > 0, x / torch.where(d > 0, d, 1.0), 0.0)
        codes = _nearest(t).clamp(-half, half - 1) + half  # stored offset: 0 .. 2^bits − 1
    packed = pack_codes(codes.reshape(out, inn), fmt.bits)  # (out, in · bits / 8)
    return QuantizedTensor(fmt, (out, inn), packed, d16, m16)


@torch.no_grad()
def error_bound(weight: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """(out, G) the largest |w − deq(q(w))| round to nearest allows in each group.

    The stored grid is {m̂ + k·d̂, k = 0 .. 2^b − 1} (symmetric: {k·d̂, k = −2^(b−1) .. 2^(b−1) − 1}).
    A weight inside the grid's range is within d̂/2 of a grid point; a weight outside it (only
    the group's extremes, pushed out by the float16 rounding of d̂ and m̂) is as far as the
    overhang. Bound = max(d̂/2, overhang) + 8 float32 ulps of the group's magnitude (the
    arithmetic in t = (w − m̂)/d̂ and in d̂·c + m̂).
    """
    out, inn = q.shape
    g = q.group
    x = weight.detach().float().reshape(out, inn // g, g)  # (out, G, g)
    d = q.scales.float()  # (out, G)
    bits = q.fmt.bits
    if q.minimums is None:
        amax = x.abs().amax(-1)
        top_grid, bottom_grid = d * (2 ** (bits - 1) - 1), -d * 2 ** (bits - 1)
        lo, hi = x.amin(-1), x.amax(-1)
        magnitude = amax + d * 2 ** (bits - 1)
    else:
        m = q.minimums.float()
        bottom_grid, top_grid = m, m + d * (2 ** bits - 1)
        lo, hi = x.amin(-1), x.amax(-1)
        magnitude = x.abs().amax(-1) + m.abs() + d * (2 ** bits - 1)
    overhang = torch.maximum(bottom_grid - lo, hi - top_grid).clamp(min=0)
    return torch.maximum(d / 2, overhang) + _FP32_SLACK * magnitude


def group_errors(weight: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """(out, G) measured max |w − deq(q(w))| per group."""
    out, inn = q.shape
    diff = (weight.detach().float() - q.dequantize()).abs()
    return diff.reshape(out, inn // q.group, q.group).amax(-1)
