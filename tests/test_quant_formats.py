"""Weight formats rounded by GGML's rules: the error bound they promise, codes in range, packing,
and bytes that are the stored tensors' nbytes (no model needed). Byte-for-byte equality with
gguf-py's quantizers: tests/test_quant_ggml_exact.py."""

from __future__ import annotations

import pytest
import torch

from engine.quant import formats
from engine.quant.formats import error_bound, group_errors, pack_codes, quantize, unpack_codes
from engine.quant.scheme import FORMATS, QuantFormat

ALL = list(FORMATS.values()) + [QuantFormat("q4_1 g64", 4, 64, True),
                                 QuantFormat("q2 sym", 2, 32, False)]


def sample_weight(out: int = 48, inn: int = 256, seed: int = 0) -> torch.Tensor:
    """(out, in) Gaussian weights with outliers, an off-centre row, a zero and a constant group."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inn, generator=g) * 0.05
    w[::7, ::13] *= 8  # outliers stretch some groups' range
    w[3] += 0.3  # a row far from 0: where a zero point pays
    w[5, :32] = 0.0  # an all-zero group: scale 0
    w[6, 32:64] = 0.125  # a constant group
    return w


def step_share(fmt: QuantFormat) -> float:
    """The part of a step |d̂| a weight may be off: half, but a whole step for Q4_0's rule (a
    weight near −p lands on the last code, 2^(b−1) − 1)."""
    return 1.0 if not fmt.zero_point and fmt.bits < 8 else 0.5


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_every_group_is_within_the_rounding_bound(fmt):
    w = sample_weight()
    q = quantize(w, fmt)
    err, bound = group_errors(w, q), error_bound(w, q)  # (out, G)
    assert err.shape == bound.shape == q.scales.shape
    assert (err <= bound).all(), float((err - bound).max())
    d = q.scales.float().abs()
    # The bound is the step share of |d̂| up to the float16 scale's rounding (≤ 128 · 2^-11 of
    # d̂ for 8-bit codes) and float32 roundings, never something looser ...
    assert (bound <= d * step_share(fmt) * (1 + 2 ** -3) + 1e-6).all()
    # ... and the data come close to half a step, so the test has something to catch.
    assert float((err / (d / 2)).nan_to_num(0).max()) > 0.9


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_rounding_down_instead_of_to_nearest_breaks_the_bound(fmt, monkeypatch):
    """The mutation check: with no half step the rounding goes down (or, for Q8_0's rounding
    away from zero, always up), a weight is up to a whole step off, and the bound test fails."""
    w = sample_weight()
    monkeypatch.setattr(formats, "_HALF", 0.0)
    q = quantize(w, fmt)
    assert (group_errors(w, q) > error_bound(w, q)).any()


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_codes_are_in_range_and_use_it(fmt):
    q = quantize(sample_weight(), fmt)
    codes = q.unpacked_codes()
    assert codes.shape == q.shape
    assert int(codes.min()) >= 0 and int(codes.max()) <= 2 ** fmt.bits - 1
    if fmt.zero_point:  # each group's min and max are grid points: codes 0 and 2^b − 1 appear
        assert int(codes.min()) == 0 and int(codes.max()) == 2 ** fmt.bits - 1


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_bytes_are_the_stored_tensors_nbytes(fmt):
    out, inn = 48, 256
    q = quantize(sample_weight(out, inn), fmt)
    groups = out * (inn // fmt.group_for(inn))
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (out, inn * fmt.bits // 8)
    assert q.scales.dtype == torch.float16 and q.scales.numel() == groups
    if fmt.zero_point:
        assert q.minimums.dtype == torch.float16 and q.minimums.numel() == groups
    else:
        assert q.minimums is None
    parts = q.codes.nbytes + q.scales.nbytes + (q.minimums.nbytes if fmt.zero_point else 0)
    assert q.nbytes == parts
    assert q.code_bytes == fmt.code_bytes(out, inn) == out * inn * fmt.bits // 8
    assert q.group_bytes == fmt.group_bytes(out, inn) == groups * (4 if fmt.zero_point else 2)
    assert q.nbytes * 8 / (out * inn) == pytest.approx(fmt.bits_per_weight(inn))


def test_bits_per_weight_of_the_named_formats():
    assert FORMATS["q4_0"].bits_per_weight() == 4.5
    assert FORMATS["q4_1"].bits_per_weight() == 5.0
    assert FORMATS["q3"].bits_per_weight() == 4.0
    assert FORMATS["q2"].bits_per_weight() == 3.0
    assert FORMATS["q8_0"].bits_per_weight() == 8.5
    assert FORMATS["int8"].bits_per_weight(576) == 8 + 16 / 576
    with pytest.raises(ValueError):
        FORMATS["int8"].bits_per_weight()


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packing_round_trips(bits):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2 ** bits, (5, 64), generator=g)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 64 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits, 64), codes)


def test_packing_layout_is_little_endian_bit_fields():
    four = pack_codes(torch.tensor([[1, 2, 15, 0]]), 4)
    assert four.tolist() == [[0x21, 0x0F]]
    two = pack_codes(torch.tensor([[1, 2, 3, 0]]), 2)
    assert two.tolist() == [[1 | 2 << 2 | 3 << 4]]
    word = sum(c << (3 * i) for i, c in enumerate([1, 2, 3, 4, 5, 6, 7, 0]))
    three = pack_codes(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0]]), 3)
    assert three.tolist() == [[word & 0xFF, word >> 8 & 0xFF, word >> 16]]


def test_dequantize_rebuilds_a_hand_made_q4_1_group():
    """Weights already on a grid m + d·c (float16 d and m) come back exactly, codes included."""
    d, m = torch.tensor(0.0625, dtype=torch.float16), torch.tensor(-0.5, dtype=torch.float16)
    codes = torch.arange(32) % 16  # every code, min 0 and max 15
    w = (d.float() * codes.float() + m.float()).unsqueeze(0)  # (1, 32)
    q = quantize(w, FORMATS["q4_1"])
    assert q.scales.item() == d.item() and q.minimums.item() == m.item()
    assert torch.equal(q.unpacked_codes()[0], codes)
    assert torch.equal(q.dequantize(), w)


def test_q4_0_scale_is_the_signed_peak_over_minus_8():
    """GGML's Q4_0, not max|w| / 7: the peak 0.7 gets code −8 with d = 0.7 / −8 < 0, zero
    stays zero, and −0.35 = 4 · d lands exactly (the old absmax / 7 rule gave d = +0.1)."""
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 0.7, -0.35
    q = quantize(w, FORMATS["q4_0"])
    assert q.scales.item() == torch.tensor(-0.0875).half().item()
    assert q.unpacked_codes()[0, :3].tolist() == [0, 12, 8]  # stored c + 8
    back = q.dequantize()[0]
    assert back[2:].abs().max() == 0 and back[0] == pytest.approx(0.7, rel=1e-3)
    assert back[1] == pytest.approx(-0.35, rel=1e-3)


def test_q8_0_rounds_halves_away_from_zero_with_the_float32_scale():
    """d = 127 / 127 = 1: ±2.5 and ±0.5 go away from zero (3, 1), where torch.round goes to
    even (2, 0)."""
    w = torch.zeros(1, 32)
    w[0, :5] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5])
    q = quantize(w, FORMATS["q8_0"])
    assert q.scales.item() == 1.0
    assert (q.unpacked_codes()[0, :5] - 128).tolist() == [127, 3, -3, 1, -1]


def test_shapes_that_do_not_split_into_groups_are_refused():
    with pytest.raises(ValueError, match="groups of 32"):
        quantize(torch.zeros(4, 100), FORMATS["q4_1"])
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.zeros(4, 4, 32), FORMATS["q4_1"])
    with pytest.raises(ValueError, match="float16"):
        quantize(torch.full((1, 32), 1e7), FORMATS["q4_0"])
