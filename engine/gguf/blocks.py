"""An opened GGUF file's tensors as stored, for the native decode step.

Why: the torch model of a `--model PATH.gguf` holds float32 copies (reader.open_gguf dequantizes
once), but the native C step can multiply by the file's own GGML blocks — Q4_1 codes stream a
seventh of float32's bytes — so the decoder of a file's own weights is built from its bytes,
read again here by the table's checked offsets (`NativeDecoder(lm, blocks=file_blocks(table))`,
native_pack.pack_blocks). The values are the same either way: the float32 copy is exactly these
blocks dequantized, which is what the step's tokens are checked against.

This module imports the native step's types, so it is a subsystem beside engine/kernels, not
part of reading a file (tests/test_layering.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import EngineError
from ..kernels.native_formats import GGML_TYPES, HEAD_NAMES, matrix_key
from ..kernels.native_records import GgmlBlocks
from .table import GGUFTable, GGUFTensor

EMBEDDING = "token_embd.weight"  # the LM head too when the file has no output.weight


def _step_matrices(table: GGUFTable) -> list[GGUFTensor]:
    """The file's tensors the step multiplies by: every layer's matrices and the LM head (the
    embedding only when it is tied to the head: the step looks up embeddings in the float copy)."""
    names = table.by_name()
    tied = not any(name in names for name in HEAD_NAMES)
    return [t for t in table.tensors if len(t.shape) == 2 and matrix_key(t.name) is not None
            and (t.name != EMBEDDING or tied)]


def blocks_problem(table: GGUFTable) -> str | None:
    """Why the native step cannot decode on this file's blocks (one line), or None: cheap, from
    the table alone (the sidebar asks before anything is packed)."""
    odd = [t for t in _step_matrices(table) if t.ggml_type not in GGML_TYPES]
    if not odd:
        return None
    types = sorted({t.ggml_type for t in odd})
    return (f"the native step reads {', '.join(GGML_TYPES)} blocks, and this file stores "
            f"{odd[0].name}{f' and {len(odd) - 1} more' if len(odd) > 1 else ''} as "
            f"{'/'.join(types)}")


def _bytes(path: Path, t: GGUFTensor) -> np.ndarray:
    """A tensor's stored bytes, copied out of a read-only map of just them."""
    return np.array(np.memmap(path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,)))


def file_blocks(table: GGUFTable) -> dict[str, GgmlBlocks | torch.Tensor]:
    """{GGUF name: the matrix's GGML blocks as stored | a norm as float32} for every tensor the
    native step reads (native_pack.pack_blocks' input); EngineError with `blocks_problem`'s line
    when a matrix is of a type the step has no kernel for."""
    problem = blocks_problem(table)
    if problem:
        raise EngineError(problem)
    path = Path(table.path)
    out: dict[str, GgmlBlocks | torch.Tensor] = {}
    for t in _step_matrices(table):
        out[t.name] = GgmlBlocks(t.ggml_type, (t.shape[0], t.shape[1]),
                                 torch.from_numpy(_bytes(path, t)))
    for t in table.tensors:
        if len(t.shape) == 1:  # the norms: float32 in every file llama.cpp writes
            out[t.name] = _norm(path, t)
    return out


def _norm(path: Path, t: GGUFTensor) -> torch.Tensor:
    raw = _bytes(path, t)
    if t.ggml_type == "F32":
        return torch.from_numpy(raw.view(np.float32).copy())
    import gguf

    values = gguf.quants.dequantize(raw.reshape(1, -1), gguf.GGMLQuantizationType[t.ggml_type])
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(t.shape).copy())
