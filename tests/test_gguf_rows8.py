"""Q4_0 with 8 rows interleaved (engine/gguf/stored_rows8.h): the same bytes in another order,
so its products must be the file's own — checked against gguf-py's dequantized weights times the
activations as the kernel rounds them (to float32 summation error), for one decode token, a tile
of 8 prompt tokens and a remainder, with the AVX2 kernels and the plain ones; and the repacked
bytes are a permutation of the stored ones (the size is the stored size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.errors import EngineError
from engine.gguf import stored

from .test_gguf_stored_kernels import random_matrix, reference_weights, rounded


def product(m: stored.StoredMatrix, x: torch.Tensor, plain: bool) -> np.ndarray:
    lib = stored.library(plain)
    x = x.contiguous()
    work = torch.empty(lib.matmul_work_bytes(m.cols, x.shape[0]), dtype=torch.uint8)
    y = torch.empty(x.shape[0], m.rows)
    lib.stored_matmul(m.address, m.code, m.rows, m.cols, x.data_ptr(), x.shape[0], y.data_ptr(),
                      2, work.data_ptr())
    return y.numpy()


@pytest.mark.parametrize("plain", [False, True], ids=["avx2", "plain"])
@pytest.mark.parametrize("tokens", [1, 8, 13])
def test_interleaved_products_are_the_files_own(plain, tokens):
    m = random_matrix("Q4_0", 48, 256, seed=tokens)
    x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(tokens))
    rows8 = stored.interleave(m)
    assert rows8.interleaved and rows8.code == stored.Q4_0X8 and rows8.nbytes == m.nbytes
    want = rounded(x.numpy().astype(np.float32)) @ reference_weights(m).astype(np.float64).T
    got = product(rows8, x, plain)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 2e-5 * scale
    assert np.abs(got - product(m, x, plain)).max() <= 2e-5 * scale  # = the row-at-a-time kernel


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


def test_single_rows_and_other_types_are_refused():
    rows8 = stored.interleave(random_matrix("Q4_0", 8, 64))
    with pytest.raises(EngineError, match="interleaved"):
        stored.rows(rows8, torch.tensor([0]))
    with pytest.raises(EngineError, match="only Q4_0"):
        stored.interleave(random_matrix("Q8_0", 8, 64))
    with pytest.raises(EngineError, match="only Q4_0"):
        stored.interleave(random_matrix("Q4_0", 12, 64))
