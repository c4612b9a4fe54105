"""The stored-blocks kernels (engine/gguf/stored.c) against gguf-py's dequantization.

Each GGML type's row product must equal the float64 product of gguf-py's dequantized weights with
the activations as the kernel rounds them (8 bits per 32 values, x ≈ dx·round(x/dx)) — to float32
summation error — for the AVX2 kernels and the plain ones alike; the batched product (the prompt's
tiles of 8 tokens and the remainder) must equal the row products; the embedding rows must be
gguf-py's values bit for bit. Random block bytes with sane float16 scales cover every code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.gguf import stored

# byte offsets of each block's float16 scale fields, set to sane values (random bytes elsewhere)
SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
          "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
TYPES = [*SCALES, "F16", "BF16", "F32"]


def random_matrix(type_name: str, rows: int, cols: int, seed: int = 0) -> stored.StoredMatrix:
    rng = np.random.default_rng(seed)
    if type_name in ("F16", "F32", "BF16"):
        w = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
        data = {"F32": w, "F16": w.astype(np.float16)}.get(type_name)
        if data is None:  # BF16: the top half of float32
            data = (w.view(np.uint32) >> 16).astype(np.uint16)
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
        return stored.StoredMatrix.view("w", type_name, rows, cols, raw)
    _, per_block, nbytes = stored.TYPES[type_name]
    blocks = rng.integers(0, 256, (rows, cols // per_block, nbytes), dtype=np.uint8)
    for at in SCALES[type_name]:
        scale = rng.uniform(0.001, 0.01, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, at:at + 2] = scale[..., None].view(np.uint8).reshape(*blocks.shape[:2], 2)
    raw = np.ascontiguousarray(blocks.reshape(rows, -1))
    return stored.StoredMatrix.view("w", type_name, rows, cols, raw)


def reference_weights(m: stored.StoredMatrix) -> np.ndarray:
    if m.type_name == "BF16":
        return (m.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return dequantize(m.data, GGMLQuantizationType[m.type_name]).reshape(m.rows, m.cols)


def rounded(x: np.ndarray, group: int = 32) -> np.ndarray:
    """The activations as the kernel sees them: per `group` values (32; 256 for the K-quants),
    dx = max|x| / 127, round(x / dx)·dx."""
    blocks = x.reshape(-1, group).astype(np.float32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return (np.rint(blocks * inv) * d).reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("plain", [False, True], ids=["avx2", "plain"])
@pytest.mark.parametrize("type_name", TYPES)
def test_row_product_is_the_dequantized_weights_times_the_rounded_activations(type_name, plain):
    m = random_matrix(type_name, 4, 576 if type_name not in ("Q4_K", "Q5_K", "Q6_K") else 512)
    w = reference_weights(m).astype(np.float64)
    x = np.random.default_rng(1).normal(0, 1, m.cols).astype(np.float32)
    seen = (x.astype(np.float64) if type_name in ("F16", "BF16", "F32")
            else rounded(x, 256 if type_name.endswith("_K") else 32))
    for r in range(m.rows):
        want = float(w[r] @ seen)
        got = stored.dot(m, r, torch.from_numpy(x), plain=plain)
        scale = float(np.abs(w[r]) @ np.abs(seen))
        assert abs(got - want) <= 2e-6 * scale, (type_name, r, got, want)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "F16"])
def test_rounding_the_activations_costs_what_8_bits_cost(type_name):
    """Against float activations the error is the 8-bit rounding's: under 1 % of Σ|w·x|."""
    m = random_matrix(type_name, 8, 1024)
    w = reference_weights(m).astype(np.float64)
    x = np.random.default_rng(2).normal(0, 1, 1024).astype(np.float32)
    for r in range(m.rows):
        got = stored.dot(m, r, torch.from_numpy(x))
        assert abs(got - float(w[r] @ x)) <= 0.01 * float(np.abs(w[r]) @ np.abs(x))


@pytest.mark.parametrize("tokens", [1, 8, 13])
@pytest.mark.parametrize("type_name", [*SCALES, "BF16"])
def test_batched_product_equals_the_row_products(type_name, tokens):
    m = random_matrix(type_name, 40, 256, seed=3)
    x = torch.from_numpy(np.random.default_rng(4).normal(0, 1, (tokens, 256)).astype(np.float32))
    y = stored.matmul(m, x)
    assert y.shape == (tokens, 40)
    want = torch.tensor([[stored.dot(m, r, x[i]) for r in range(40)] for i in range(tokens)])
    assert torch.allclose(y, want, rtol=0, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("type_name", TYPES)
def test_embedding_rows_are_gguf_py_values(type_name):
    m = random_matrix(type_name, 6, 256, seed=5)
    got = stored.rows(m, torch.tensor([[5, 0], [2, 2]])).numpy()
    want = reference_weights(m)
    assert got.shape == (2, 2, 256)
    assert np.array_equal(got[0, 0], want[5]) and np.array_equal(got[1, 1], want[2])


def test_a_type_without_a_kernel_or_a_short_buffer_is_one_line():
    with pytest.raises(Exception, match="IQ2_XS has no kernel"):
        stored.StoredMatrix.view("w", "IQ2_XS", 2, 256, np.zeros(10, np.uint8))
    with pytest.raises(Exception, match="bytes where"):
        stored.StoredMatrix.view("w", "Q4_0", 2, 64, np.zeros(10, np.uint8))


@pytest.mark.parametrize("cols", [4096, 896])  # whole groups of 256 and not (then no K view)
def test_the_activations_are_rounded_alike_by_both_builds_and_numpy(cols):
    """quantize_act's AVX2 path and its plain loop write the same bytes, and the int8 codes are
    numpy's round-half-to-even of x / dx (exact ties included: a block holding 127 has dx = 1)."""
    import ctypes

    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, cols).astype(np.float32)
    x[:32] = np.concatenate([[127.0], np.arange(31) - 15.5]).astype(np.float32)  # ties at .5
    x[32:64] = 0.0  # an all-zero block: dx = 0, codes 0
    made = []
    for plain in (False, True):
        lib = stored.library(plain)
        lib.quantize_act.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        act = np.zeros(lib.act_bytes(cols), dtype=np.uint8)
        lib.quantize_act(x.ctypes.data, cols, act.ctypes.data)
        made.append(act)
    assert np.array_equal(made[0], made[1])
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    assert np.array_equal(made[0][:cols].view(np.int8), np.rint(blocks * inv).astype(np.int8).ravel())


@pytest.mark.parametrize("threads", [1, 2])
def test_the_plain_read_reads_every_byte_once(threads):
    """stored_read (the bracketed MBU's read) returns the XOR of every 8 bytes of its buffers,
    each split among the threads: numpy's XOR of the same words, so no line is skipped or read
    twice."""
    import ctypes

    rng = np.random.default_rng(7)
    parts = [rng.integers(0, 2**63, n, dtype=np.uint64) for n in (8 * 1000, 8 * 37, 8 * 4096)]
    lib = stored.library()
    addresses = (ctypes.c_void_p * 3)(*[p.ctypes.data for p in parts])
    sizes = (ctypes.c_int64 * 3)(*[p.nbytes for p in parts])
    want = np.bitwise_xor.reduce(np.concatenate(parts))
    assert lib.stored_read(addresses, sizes, 3, threads) == int(want)
    assert stored.plain_read_s([(p.ctypes.data, p.nbytes) for p in parts], threads) > 0
