"""Q4_0, Q8_0, Q4_K and Q6_K with 8 rows interleaved (engine/gguf/stored_rows8.h, 8q8.h, 8k.h,
8q6.h): the
same bytes in another order,
so its products must be the file's own — checked against gguf-py's dequantized weights times the
activations as the kernel rounds them (to float32 summation error), for one decode token, a tile
of 8 prompt tokens and a remainder, with the AVX2 kernels and the plain ones; and the repacked
bytes are a permutation of the stored ones (the size is the stored size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.cbuild import cpu_flags
from engine.errors import EngineError
from engine.gguf import stored

from .test_gguf_stored_kernels import random_matrix, reference_weights, rounded


def product(m: stored.StoredMatrix, x: torch.Tensor, plain: bool, vnni: bool = True) -> np.ndarray:
    lib = stored.library(plain, vnni)
    x = x.contiguous()
    work = torch.empty(lib.matmul_work_bytes(m.cols, x.shape[0]), dtype=torch.uint8)
    y = torch.empty(x.shape[0], m.rows)
    lib.stored_matmul(m.address, m.code, m.rows, m.cols, x.data_ptr(), x.shape[0], y.data_ptr(),
                      2, work.data_ptr())
    return y.numpy()


@pytest.mark.parametrize("plain", [False, True], ids=["avx2", "plain"])
@pytest.mark.parametrize("tokens", [1, 8, 13])
@pytest.mark.parametrize("kind, code", [("Q4_0", stored.Q4_0X8), ("Q8_0", stored.Q8_0X8),
                                        ("Q4_K", stored.Q4_KX8), ("Q6_K", stored.Q6_KX8)])
def test_interleaved_products_are_the_files_own(kind, code, plain, tokens):
    m = random_matrix(kind, 48, 512, seed=tokens)
    x = torch.randn(tokens, 512, generator=torch.Generator().manual_seed(tokens))
    rows8 = stored.interleave(m)
    assert rows8.interleaved and rows8.code == code and rows8.nbytes == m.nbytes
    group = 32 if kind in ("Q4_0", "Q8_0") else 256  # the activations' rounding each type's kernel reads
    want = rounded(x.numpy().astype(np.float32), group) @ reference_weights(m).astype(np.float64).T
    got = product(rows8, x, plain)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 2e-5 * scale
    assert np.abs(got - product(m, x, plain)).max() <= 2e-5 * scale  # = the row-at-a-time kernel


@pytest.mark.skipif("avx512_vnni" not in cpu_flags().split() or "avx512vl" not in cpu_flags().split(),
                    reason="this CPU has no AVX-512 VNNI: the kernels use AVX2's sums only")
@pytest.mark.parametrize("tokens", [1, 8, 13])
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K",
                                  "Q4_0x8", "Q8_0x8", "Q4_Kx8", "Q6_Kx8"])
def test_vnni_sums_are_avx2s_bit_for_bit(kind, tokens):
    """dpbusd adds a lane's four products in int32 where AVX2 adds pairs in int16 (which the
    codes' ranges keep from saturating), and the float arithmetic after is the same: so the
    products are the same floats, not merely close."""
    m = random_matrix(kind.removesuffix("x8"), 48, 512, seed=tokens)
    if kind.endswith("x8"):
        m = stored.interleave(m)
    x = torch.randn(tokens, 512, generator=torch.Generator().manual_seed(tokens))
    assert np.array_equal(product(m, x, False), product(m, x, False, vnni=False))


def test_the_layout_is_a_permutation_of_the_stored_bytes():
    m = random_matrix("Q4_0", 16, 64)
    rows8 = stored.interleave(m).data.reshape(2, 2, 144)  # (group, block column, 8 rows' bytes)
    blocks = m.data.reshape(16, 2, 18)
    for g in range(2):
        for j in range(2):
            packed = rows8[g, j]
            scales = [packed[2 * i:2 * i + 2].tobytes() for i in range(8)]
            assert scales == [blocks[8 * g + r, j, :2].tobytes() for r in (0, 2, 4, 6, 1, 3, 5, 7)]
            for r in range(8):
                assert packed[16 + 16 * r:32 + 16 * r].tobytes() == blocks[8 * g + r, j, 2:].tobytes()


def test_the_q4_k_layout_is_a_permutation_of_the_stored_bytes():
    m = random_matrix("Q4_K", 16, 512)
    rows8 = stored.interleave(m).data.reshape(2, 2, 1152)  # (group, super-block column, 8 rows)
    blocks = m.data.reshape(16, 2, 144)
    for g in range(2):
        for s in range(2):
            packed = rows8[g, s]
            for r in range(8):
                b = blocks[8 * g + r, s]
                assert packed[2 * r:2 * r + 2].tobytes() == b[:2].tobytes()  # d
                assert packed[16 + 2 * r:18 + 2 * r].tobytes() == b[2:4].tobytes()  # dmin
                for w in range(3):  # the packed scales, word by word
                    at = 32 + 32 * w + 4 * r
                    assert packed[at:at + 4].tobytes() == b[4 + 4 * w:8 + 4 * w].tobytes()
                for p in range(4):
                    for q in range(8):
                        at = 128 + 256 * p + 32 * q + 4 * r
                        assert packed[at:at + 4].tobytes() == b[16 + 32 * p + 4 * q:][:4].tobytes()


def test_the_q6_k_layout_is_a_permutation_of_the_stored_bytes():
    m = random_matrix("Q6_K", 8, 256)
    packed = stored.interleave(m).data.reshape(1680)
    b = m.data.reshape(8, 210)
    seen = []
    for r in range(8):
        seen += [(packed[2 * r:2 * r + 2], b[r, 208:210])]
        seen += [(packed[16 + 32 * w + 4 * r:][:4], b[r, 192 + 4 * w:][:4]) for w in range(4)]
        for h in range(2):
            for q in range(8):
                seen += [(packed[144 + 512 * h + 256 * k + 32 * q + 4 * r:][:4],
                          b[r, 64 * h + 32 * k + 4 * q:][:4]) for k in range(2)]
                seen += [(packed[1168 + 256 * h + 32 * q + 4 * r:][:4],
                          b[r, 128 + 32 * h + 4 * q:][:4])]
    assert all(ours.tobytes() == theirs.tobytes() for ours, theirs in seen)
    assert sum(len(ours) for ours, _ in seen) == 1680  # every byte placed once


def test_a_file_matrix_interleaved_a_slice_at_a_time_equals_the_whole(tmp_path, monkeypatch):
    from engine.gguf import mapped

    m = random_matrix("Q4_K", 40, 256, seed=3)
    path = tmp_path / "rows.bin"
    path.write_bytes(b"\0" * 7 + m.data.tobytes())
    tensor = type("T", (), {"name": "w", "ggml_type": "Q4_K", "shape": (40, 256), "offset": 7,
                            "nbytes": m.nbytes})()
    monkeypatch.setattr(mapped, "SLICE_ROWS", 16)  # 16 + 16 + 8 rows
    got = mapped._matrix(mapped.FileMap(path), tensor, "qwen2", None, rows8=True)
    assert got.interleaved and np.array_equal(got.data, stored.interleave(m).data)


def test_single_rows_and_other_types_are_refused():
    rows8 = stored.interleave(random_matrix("Q4_0", 8, 64))
    with pytest.raises(EngineError, match="interleaved"):
        stored.rows(rows8, torch.tensor([0]))
    with pytest.raises(EngineError, match="only Q4_0, Q8_0, Q4_K and Q6_K"):
        stored.interleave(random_matrix("Q4_1", 8, 64))
    with pytest.raises(EngineError, match="only Q4_0, Q8_0, Q4_K and Q6_K"):
        stored.interleave(random_matrix("Q4_0", 12, 64))
    with pytest.raises(EngineError, match="interleaved"):
        stored.dot(stored.interleave(random_matrix("Q4_K", 8, 256)), 0, torch.zeros(256))
