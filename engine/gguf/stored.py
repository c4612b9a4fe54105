"""Matrices as a GGUF file stores them, multiplied in place (engine/gguf/stored.c).

A `StoredMatrix` is a view of a tensor's bytes inside the memory-mapped file — no copy, no float32
version — with its GGML type and shape. `matmul` multiplies a batch of activations by it (the
prompt's tokens at once, or one decode token), `rows` dequantizes a few rows (the embedding
lookup), and `StoredLinear` / `StoredEmbedding` put both in a transformers model where
`nn.Linear` / `nn.Embedding` were, so every forward the pages run (prefill, the torch decoder,
what-if hooks, patching) reads the file's blocks. The activations are rounded to 8 bits per 32
values inside the kernel, as llama.cpp does (stored.c says why).

Shapes: M = tokens in a forward, K = a row's length (the input width), N = rows (output width).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from ..cbuild import build
from ..errors import EngineError

SOURCE = Path(__file__).with_name("stored.c")
HEADERS = ("stored_blocks.h", "stored_avx2.h", "stored_rows8.h", "stored_rows8k.h",
           "stored_rows8q6.h", "stored_rows8q8.h", "stored_step.h")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
# GGML type name → (type number, weights a block, bytes a block): the types stored.c reads
TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
         "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144),
         "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}
# stored.c's numbers for Q4_0, Q8_0, Q4_K and Q6_K with 8 rows interleaved (stored_rows8.h,
# 8q8.h, 8k.h, 8q6.h)
Q4_0X8, Q8_0X8, Q4_KX8, Q6_KX8 = 102, 108, 112, 114
INTERLEAVED = {"Q4_0": (Q4_0X8, "repack_q4_0x8"), "Q8_0": (Q8_0X8, "repack_q8_0x8"),
               "Q4_K": (Q4_KX8, "repack_q4_kx8"), "Q6_K": (Q6_KX8, "repack_q6_kx8")}


@cache
def library(plain: bool = False, vnni: bool = True) -> ctypes.CDLL:
    """stored.c compiled for this CPU (AVX2 kernels where it has them, their integer sums in
    AVX-512 VNNI's dpbusd where it has that), or with the plain kernels only, or AVX2's sums
    without VNNI (tests compare them)."""
    extra = (["-DPLAIN_KERNELS"] if plain else []) + ([] if vnni else ["-DNO_VNNI"])
    lib = build(SOURCE, HEADERS, FLAGS + extra, "stored-blocks kernels")
    void_p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.act_bytes.argtypes, lib.act_bytes.restype = [i64], i64
    lib.matmul_work_bytes.argtypes, lib.matmul_work_bytes.restype = [i64, i64], i64
    lib.stored_matmul.argtypes = [void_p, i64, i64, i64, void_p, i64, void_p, ctypes.c_int, void_p]
    lib.stored_matmul.restype = None
    lib.stored_rows.argtypes = [void_p, i64, i64, void_p, i64, void_p]
    lib.stored_rows.restype = None
    lib.stored_dot.argtypes = [void_p, i64, i64, void_p, void_p, ctypes.c_int]
    lib.stored_dot.restype = ctypes.c_float
    lib.stored_read.argtypes = [void_p, void_p, i64, ctypes.c_int]
    lib.stored_read.restype = ctypes.c_uint64
    for _, repack in INTERLEAVED.values():
        getattr(lib, repack).argtypes = [void_p, i64, i64, void_p, ctypes.c_int]
        getattr(lib, repack).restype = None
    return lib


def problem(type_name: str, cols: int) -> str | None:
    """Why the kernels cannot read a matrix of this type and row length (one line), or None."""
    if type_name not in TYPES:
        return f"GGML type {type_name} has no kernel here (reads {', '.join(TYPES)})"
    block = TYPES[type_name][1]
    if cols % 32 or cols % block:
        return f"a row of {cols} weights is not a whole number of {type_name} blocks"
    return None


@dataclass(frozen=True, slots=True, eq=False)
class StoredMatrix:
    """A (rows, cols) matrix as GGML rows of `type_name`: `data` is a uint8 view (rows,
    row_bytes) of the mapped file (or of a copy at the same size). `interleaved`: a Q4_0, Q4_K or
    Q6_K copy with 8 rows side by side (`interleave`), the same bytes in another order."""

    name: str
    type_name: str
    rows: int
    cols: int
    data: np.ndarray
    interleaved: bool = False

    @property
    def code(self) -> int:
        return INTERLEAVED[self.type_name][0] if self.interleaved else TYPES[self.type_name][0]

    @property
    def row_bytes(self) -> int:
        _, per_block, nbytes = TYPES[self.type_name]
        return self.cols // per_block * nbytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def address(self) -> int:
        return self.data.ctypes.data

    @classmethod
    def view(cls, name: str, type_name: str, rows: int, cols: int, data: np.ndarray
             ) -> "StoredMatrix":
        """Checked: the type has a kernel, the bytes are exactly rows · row bytes."""
        why = problem(type_name, cols)
        if why:
            raise EngineError(f"tensor {name}: {why}")
        matrix = cls(name, type_name, rows, cols, data)
        if data.dtype != np.uint8 or data.size != matrix.nbytes:
            raise EngineError(f"tensor {name}: {data.size} bytes where {matrix.nbytes} are needed")
        return matrix


def can_interleave(type_name: str, rows: int) -> bool:
    return type_name in INTERLEAVED and rows % 8 == 0


def interleave(m: StoredMatrix) -> StoredMatrix:
    """A Q4_0, Q8_0, Q4_K or Q6_K matrix's copy with its rows 8 by 8 side by side, at the stored size:
    its kernel does a half (Q4_0) to 60 % (the K-quants) of the instructions a row at a time
    does, which are the decode step's limit (stored_rows8.h, stored_rows8k.h say why). Its
    products are the same sums; only rows() and dot(), which read single rows, refuse it."""
    if not can_interleave(m.type_name, m.rows) or m.interleaved:
        raise EngineError(f"{m.name}: only Q4_0, Q8_0, Q4_K and Q6_K rows, 8 at a time, are "
                          "interleaved")
    out = np.empty_like(m.data)
    repack_into(m.type_name, m.cols, m.data, out)
    return StoredMatrix(m.name, m.type_name, m.rows, m.cols, out, interleaved=True)


def repack_into(type_name: str, cols: int, src: np.ndarray, dst: np.ndarray) -> None:
    """Rows `src` (a multiple of 8 of them, uint8 (rows, row bytes)) interleaved into `dst`, the
    same rows' place in an interleaved matrix: a file's matrix is interleaved a slice at a time,
    so no second copy of it is ever held whole."""
    if src.shape != dst.shape or src.shape[0] % 8 or not src.flags.c_contiguous \
            or not dst.flags.c_contiguous:
        raise EngineError("interleaving needs whole groups of 8 contiguous rows")
    getattr(library(), INTERLEAVED[type_name][1])(src.ctypes.data, src.shape[0], cols,
                                                  dst.ctypes.data, max(1, torch.get_num_threads()))


def _single_rows(m: StoredMatrix) -> None:
    if m.interleaved:
        raise EngineError(f"{m.name}: its rows are interleaved 8 by 8; read the file's own")


def matmul(m: StoredMatrix, x: torch.Tensor) -> torch.Tensor:
    """x (M, K) float32 → x · Wᵀ (M, N) float32, on the stored blocks."""
    x = x.to(torch.float32).contiguous()
    count, k = x.shape
    if k != m.cols:
        raise EngineError(f"{m.name}: input width {k}, the matrix has {m.cols} columns")
    lib = library()
    threads = max(1, torch.get_num_threads())
    work = torch.empty(lib.matmul_work_bytes(k, count), dtype=torch.uint8)
    y = torch.empty(count, m.rows)
    lib.stored_matmul(m.address, m.code, m.rows, k, x.data_ptr(), count, y.data_ptr(), threads,
                      work.data_ptr())
    return y


def rows(m: StoredMatrix, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (any shape) dequantized to float32: (*ids.shape, cols)."""
    _single_rows(m)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= m.rows):
        raise EngineError(f"{m.name}: a token id outside 0..{m.rows - 1}")
    out = torch.empty(flat.numel(), m.cols)
    library().stored_rows(m.address, m.code, m.cols, flat.data_ptr(), flat.numel(), out.data_ptr())
    return out.reshape(*ids.shape, m.cols)


def dot(m: StoredMatrix, row: int, x: torch.Tensor, plain: bool = False) -> float:
    """Row `row` · x by the AVX2 (or plain) kernel: what tests check each type with."""
    _single_rows(m)
    x = x.to(torch.float32).contiguous()
    lib = library()
    act = torch.empty(lib.act_bytes(m.cols), dtype=torch.uint8)
    return float(lib.stored_dot(m.address + row * m.row_bytes, m.code, m.cols, x.data_ptr(),
                                act.data_ptr(), int(plain)))


def plain_read_s(parts: list[tuple[int, int]], threads: int) -> float:
    """Seconds one plain read of `parts` ((address, bytes) each) takes with `threads`: the
    bytes a decode step streams, read and nothing else (stored.c's `stored_read`)."""
    lib = library()
    addresses = (ctypes.c_void_p * len(parts))(*[a for a, _ in parts])
    sizes = (ctypes.c_int64 * len(parts))(*[n for _, n in parts])
    start = time.perf_counter()
    lib.stored_read(addresses, sizes, len(parts), threads)
    return time.perf_counter() - start


class StoredLinear(torch.nn.Module):
    """nn.Linear's place in the model, computed on a stored matrix (+ a float32 bias)."""

    def __init__(self, matrix: StoredMatrix, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.matrix = matrix
        self.in_features, self.out_features = matrix.cols, matrix.rows
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) → (..., N)
        y = matmul(self.matrix, x.reshape(-1, self.in_features))
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        m = self.matrix
        rows8 = ", 8 rows interleaved" if m.interleaved else ""
        return f"{m.name}: {m.rows} × {m.cols} {m.type_name}{rows8}, {m.nbytes:,} bytes as stored"


class StoredEmbedding(torch.nn.Module):
    """nn.Embedding's place: the looked-up rows dequantized, the table left as stored."""

    def __init__(self, matrix: StoredMatrix) -> None:
        super().__init__()
        self.matrix = matrix
        self.num_embeddings, self.embedding_dim = matrix.rows, matrix.cols

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (...) → (..., hidden)
        return rows(self.matrix, ids)

    @property
    def weight(self) -> torch.Tensor:
        """The whole table dequantized (V, hidden) float32: a copy of 4 bytes a weight, made only
        for a page that asks for it (the embedding neighbours), never for a forward."""
        return rows(self.matrix, torch.arange(self.matrix.rows))

    def extra_repr(self) -> str:
        m = self.matrix
        return f"{m.name}: {m.rows} × {m.cols} {m.type_name}, {m.nbytes:,} bytes as stored"
