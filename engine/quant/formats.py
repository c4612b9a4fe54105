"""GGML's weight quantizers, and round-to-nearest formats of our own built the same way, whose
stored form is real tensors, so that "bytes" is what the tensors hold (`nbytes`), not what a
formula says they should.

A weight W of shape (out, in) is split into groups along `in` (see `scheme`); each group keeps a
float16 scale (and, with a zero point, a float16 minimum) and one code per weight, packed into
uint8 bytes. The codes are chosen exactly as GGML's reference quantizers choose them (ggml-quants.c,
and gguf-py's `gguf.quants`, the reference the tests compare with byte for byte), so q4_0, q4_1
and q8_0 are GGML's Q4_0, Q4_1 and Q8_0 bit for bit (`ggml_blocks` writes their block bytes):
- zero point (Q4_1; q3, q2): d = (max − min) / (2^b − 1), c = trunc((w − min) · (1/d) + 0.5);
- symmetric 8-bit (Q8_0; int8 per row): d = max|w| / 127, c = w · (1/d) rounded half away from 0;
- symmetric < 8 bits (Q4_0): the weight of largest magnitude, signed, p; d = p / −2^(b−1), so p
  gets code −2^(b−1) exactly and d may be negative; c = trunc(w · (1/d) + 2^(b−1) + 0.5) − 2^(b−1),
  clamped (a weight near −p lands on 2^(b−1) − 1: a whole step off, GGML's trade for the extra
  level).
The codes come from the float32 d (and min); d and min are rounded to float16 only when stored,
as GGML does. `dequantize()` rebuilds float32 values as GGUF readers do (d · c + m), so a weight
that came from a Q4_1 file is rebuilt bit for bit (see `gguf_grid`).

What the rounding promises (`error_bound` computes it per group): a weight inside the float32
grid's range is at most half a step from its grid point, |w − (d·c + m)| ≤ |d|/2; a weight
outside it (Q4_0's −p side) by the overhang. Storing d and m as float16 moves each grid point by
|c|·|d − d̂| + |m − m̂| more; plus a few float32 roundings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .scheme import QuantFormat

_FP32_SLACK = 2.0 ** -21  # 8 float32 ulps (2^-24 each) of the group's magnitude
_HALF = 0.5  # the half step of every rounding below (a test sets 0, rounding down, to show
# that the error bound then fails)


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
        """(out, in) float32: d · c + m per group (symmetric: d · (c − 2^(bits−1))), as GGUF
        readers compute it (`stored_values`)."""
        out, inn = self.shape
        g = self.group
        c = self.unpacked_codes().reshape(out, inn // g, g).float()  # (out, G, g)
        m = None if self.minimums is None else self.minimums.unsqueeze(-1)  # (out, G, 1)
        return stored_values(c, self.scales.unsqueeze(-1), m, self.fmt.bits).reshape(out, inn)


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


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """GGML's id = 1/d, and 0 for an all-zero (or constant) group, whose codes then come out
    as the rounding of 0 (symmetric: code 0; zero point: code 0, value = min)."""
    return torch.where(d == 0, 0.0, 1.0 / d)


def choose_codes(x: torch.Tensor, fmt: QuantFormat
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GGML's rule for `fmt` on grouped weights x (out, G, g) float32: codes (out, G, g) as
    float32 integers stored offset to [0, 2^bits) (symmetric c + 2^(bits−1)), and the float32
    scale d and minimum m (None when symmetric) (out, G, 1) the codes were chosen with, before
    float16. Every float32 operation is GGML's, in its order, so the codes are its codes."""
    half = 2 ** (fmt.bits - 1)
    if fmt.zero_point:  # Q4_1
        top = 2 ** fmt.bits - 1
        lo = x.amin(-1, keepdim=True)  # (out, G, 1)
        d = (x.amax(-1, keepdim=True) - lo) / top
        codes = torch.trunc((x - lo) * _inverse(d) + _HALF).clamp_(0, top)
        return codes, d, lo
    if fmt.bits == 8:  # Q8_0: round half away from zero (frac ≥ 0.5 is exact in float32)
        d = x.abs().amax(-1, keepdim=True) / (half - 1)
        t = x * _inverse(d)
        a = t.abs()
        whole = a.floor()
        c = torch.sign(t) * (whole + (a - whole >= _HALF).float())
        return c.clamp_(-half, half - 1) + half, d, None
    # Q4_0: the first weight of largest magnitude (numpy's argmax, as gguf-py), signed
    peak = x.gather(-1, x.abs().argmax(-1, keepdim=True))  # (out, G, 1)
    d = peak / -half
    codes = torch.trunc(x * _inverse(d) + (half + _HALF)).clamp_(0, 2 * half - 1)
    return codes, d, None


def stored_values(codes: torch.Tensor, d16: torch.Tensor, m16: torch.Tensor | None,
                  bits: int) -> torch.Tensor:
    """d̂ · c + m̂ (zero point) or d̂ · (c − 2^(bits−1)) in float32, as GGUF readers compute it;
    codes (…, g) offset as `choose_codes` returns them, d̂ and m̂ float16 (…, 1)."""
    if m16 is None:
        return d16.float() * (codes - 2 ** (bits - 1))
    return d16.float() * codes + m16.float()


def rounded(weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """deq(q(weight)) (out, in) float32 without packing the codes (packing is most of
    `quantize`'s time; the AWQ search rounds many candidate scales); equal to
    `quantize(weight, fmt).dequantize()` value for value."""
    out, inn = weight.shape
    g = fmt.group_for(inn)
    x = weight.detach().float().reshape(out, inn // g, g)  # (out, G, g)
    codes, d, m = choose_codes(x, fmt)
    return stored_values(codes, d.half(), None if m is None else m.half(), fmt.bits).reshape(out, inn)


@torch.no_grad()
def quantize(weight: torch.Tensor, fmt: QuantFormat) -> QuantizedTensor:
    """`weight` (out, in) on `fmt`'s per-group grid by GGML's rule (`choose_codes`); the scale
    and minimum it chose the codes with, rounded to float16, are what is stored."""
    if weight.dim() != 2:
        raise ValueError(f"a weight matrix is 2-D (out, in), not {tuple(weight.shape)}")
    out, inn = weight.shape
    fmt.check_shape(out, inn)
    g = fmt.group_for(inn)
    x = weight.detach().float().reshape(out, inn // g, g)  # (out, G, g)
    codes, d, m = choose_codes(x, fmt)
    d16 = _scale16(d.squeeze(-1), "scale")  # (out, G)
    m16 = None if m is None else _scale16(m.squeeze(-1), "minimum")
    packed = pack_codes(codes.reshape(out, inn), fmt.bits)  # (out, in · bits / 8)
    return QuantizedTensor(fmt, (out, inn), packed, d16, m16)


@torch.no_grad()
def error_bound(weight: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """(out, G) the largest |w − deq(q(w))| the rounding allows in each group.

    The float32 grid the codes were chosen on is {m + k·d} (symmetric m = 0, k ∈ [−2^(b−1),
    2^(b−1) − 1]; zero point k ∈ [0, 2^b − 1]). A weight inside its range is within |d|/2 of
    its grid point, one outside it (Q4_0's weights near −p) as far as the overhang. The stored
    grid moves point k by |k|·|d − d̂| + |m − m̂|. Bound = max(|d|/2, overhang) + max|k|·|d − d̂|
    + |m − m̂| + 8 float32 ulps of the group's magnitude.
    """
    out, inn = q.shape
    g = q.group
    x = weight.detach().float().reshape(out, inn // g, g)  # (out, G, g)
    _, d, m = choose_codes(x, q.fmt)
    d = d.squeeze(-1)  # (out, G)
    bits = q.fmt.bits
    k_lo, k_hi = (0, 2 ** bits - 1) if q.minimums is not None else (-2 ** (bits - 1),
                                                                    2 ** (bits - 1) - 1)
    m = torch.zeros_like(d) if m is None else m.squeeze(-1)
    m16 = torch.zeros_like(d) if q.minimums is None else q.minimums.float()
    bottom = torch.minimum(d * k_lo, d * k_hi) + m
    top = torch.maximum(d * k_lo, d * k_hi) + m
    lo, hi = x.amin(-1), x.amax(-1)
    overhang = torch.maximum(bottom - lo, hi - top).clamp(min=0)
    moved = max(-k_lo, k_hi) * (d - q.scales.float()).abs() + (m - m16).abs()
    magnitude = x.abs().amax(-1) + m.abs() + d.abs() * 2 ** bits
    return torch.maximum(d.abs() / 2, overhang) + moved + _FP32_SLACK * magnitude


def group_errors(weight: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """(out, G) measured max |w − deq(q(w))| per group."""
    out, inn = q.shape
    diff = (weight.detach().float() - q.dequantize()).abs()
    return diff.reshape(out, inn // q.group, q.group).amax(-1)
