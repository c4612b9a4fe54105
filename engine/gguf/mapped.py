"""A GGUF opened as llama.cpp opens it: memory-mapped, every matrix left in its stored blocks.

The model is transformers' own class for the architecture (so every hook, recorder and patch of
the pages sees the usual module names), made on the meta device; then each linear layer becomes a
`StoredLinear` and the embedding a `StoredEmbedding` over a view of the mapped file
(engine/gguf/stored.py), and the norms, biases and rotary tables are the only float32 tensors
made. What the process holds is the file's pages the forwards touch (the kernel reads them in
and may drop them again), plus the KV cache and work buffers: an 8B Q4_K_M file opens in about
the time it takes to read its header and vocabulary.

One exception to "as stored": a llama file's q and k rows are in llama.cpp's RoPE pair order
(names.py), and transformers rotates halves, so those two matrices are copied once with their
rows put back in Hugging Face's order — row by row, at the stored size, read with pread so the
file's own pages of them are never mapped in (the process holds each once). Whole rows of GGML
blocks move, so the values are the file's bit for bit. Likewise a Q4_0, Q4_K or Q6_K linear layer's
matrix (and an untied head's) is copied with its rows interleaved 8 by 8 (the same bytes,
reordered; stored_rows8.h says why the decode step wants them so), read and interleaved a slice
of rows at a time: the process then holds that copy instead of the file's pages.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .header import GGUFError, Header
from .names import PERMUTED, QK_NORMED, ROPE_FREQS, Shapes, heads_for, unpermute
from .stored import (
    StoredEmbedding,
    StoredLinear,
    StoredMatrix,
    can_interleave,
    interleave,
    problem,
    repack_into,
)
from .table import GGUFTensor

SLICE_ROWS = 1024  # rows read and interleaved at a time (a multiple of 8)
_LINEAR = {"attn_q": ("self_attn", "q_proj"), "attn_k": ("self_attn", "k_proj"),
           "attn_v": ("self_attn", "v_proj"), "attn_output": ("self_attn", "o_proj"),
           "ffn_gate": ("mlp", "gate_proj"), "ffn_up": ("mlp", "up_proj"),
           "ffn_down": ("mlp", "down_proj")}
_NORMS = {"attn_norm": ("input_layernorm",), "ffn_norm": ("post_attention_layernorm",),
          "attn_q_norm": ("self_attn", "q_norm"), "attn_k_norm": ("self_attn", "k_norm")}


def stored_problem(header: Header) -> str | None:
    """Why a file's matrices cannot run on their blocks here (one line), or None."""
    for t in header.table.tensors:
        if len(t.shape) == 2:
            why = problem(t.ggml_type, t.shape[1])
            if why:
                return f"tensor {t.name}: {why}"
    return None


class FileMap:
    """The file mapped read-only once; views of its tensors' bytes, and pread copies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)

    def view(self, t: GGUFTensor) -> np.ndarray:
        """(rows, row bytes) uint8 view of a matrix's blocks inside the map: no copy."""
        rows = t.shape[0] if len(t.shape) == 2 else 1
        return self.bytes[t.offset:t.offset + t.nbytes].reshape(rows, -1)

    def read(self, t: GGUFTensor, into: np.ndarray | None = None, row: int = 0) -> np.ndarray:
        """A private copy of a tensor's bytes (or, `into`, of as many of its rows as `into`
        holds, from `row` on), read without mapping its pages."""
        rows = t.shape[0] if len(t.shape) == 2 else 1
        out = np.empty(t.nbytes, dtype=np.uint8) if into is None else into
        fd = os.open(self.path, os.O_RDONLY)
        try:
            got = os.preadv(fd, [out], t.offset + row * (t.nbytes // rows))
        finally:
            os.close(fd)
        if got != out.nbytes:
            raise GGUFError(f"{self.path.name}: tensor {t.name} ends past the end of the file")
        return out.reshape(rows, -1) if into is None else out

    def floats(self, t: GGUFTensor) -> torch.Tensor:
        """A small tensor (a norm, a bias, RoPE's divisors) as float32, copied."""
        if t.ggml_type == "F32":
            return torch.from_numpy(self.read(t).view(np.float32).reshape(t.shape).copy())
        import gguf

        values = gguf.quants.dequantize(self.read(t), gguf.GGMLQuantizationType[t.ggml_type])
        return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(t.shape).copy())


def _matrix(fm: FileMap, t: GGUFTensor, arch: str, s: Shapes, rows8: bool = False
            ) -> StoredMatrix:
    """A tensor's stored matrix: a view of the map, or a copy at the stored size where its rows
    are reordered (llama's q/k) or, `rows8`, interleaved 8 by 8 (a Q4_0, Q8_0, Q4_K or Q6_K matrix the
    decode step streams: stored_rows8.h), read with pread so the map's pages of it stay out of
    memory."""
    n_head = heads_for(t.name, s.heads, s.kv_heads) if arch in PERMUTED else None
    rows8 = rows8 and can_interleave(t.ggml_type, t.shape[0])
    if n_head is not None:  # row i of the HF order is row order[i] of the file
        order = unpermute(torch.arange(t.shape[0])[:, None], n_head)[:, 0].numpy()
        matrix = StoredMatrix.view(t.name, t.ggml_type, t.shape[0], t.shape[1],
                                   np.ascontiguousarray(fm.read(t)[order]))
        return interleave(matrix) if rows8 else matrix
    if not rows8:
        return StoredMatrix.view(t.name, t.ggml_type, t.shape[0], t.shape[1], fm.view(t))
    out = np.empty((t.shape[0], t.nbytes // t.shape[0]), dtype=np.uint8)
    matrix = StoredMatrix.view(t.name, t.ggml_type, t.shape[0], t.shape[1], out)  # checked first
    chunk = np.empty((min(SLICE_ROWS, t.shape[0]), out.shape[1]), dtype=np.uint8)
    for r0 in range(0, t.shape[0], SLICE_ROWS):  # a slice at a time: no second whole copy
        rows = chunk[:min(SLICE_ROWS, t.shape[0] - r0)]
        fm.read(t, rows.reshape(-1), r0)
        repack_into(t.ggml_type, t.shape[1], rows, out[r0:r0 + len(rows)])
    return dataclasses.replace(matrix, interleaved=True)


def _set(module: Any, path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        module = getattr(module, name)
    setattr(module, path[-1], value)


def rope_frequencies(model: Any, config: Any, factors: torch.Tensor | None) -> None:
    """The rotary embedding's buffers on the CPU (the meta model has none), with Llama 3.x's
    per-frequency divisors from the file applied as llama.cpp applies them (θ_i / factor_i)."""
    inner = model.model
    inner.rotary_emb = type(inner.rotary_emb)(config=config)
    if factors is not None:
        rot = inner.rotary_emb
        rot.inv_freq = rot.inv_freq / factors.to(rot.inv_freq.dtype)
        rot.original_inv_freq = rot.inv_freq


def mapped_model(header: Header, arch: str, s: Shapes, config: Any) -> Any:
    """The transformers model of a checked file, on its mapped blocks (see the module's doc)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    fm = FileMap(Path(header.table.path))
    tensors = header.table.by_name()
    layers = model.model.layers
    for name, t in tensors.items():
        if not name.startswith("blk."):
            continue
        _, index, leaf, kind = name.split(".")
        layer = layers[int(index)]
        if leaf in _LINEAR and kind == "weight":
            bias = tensors.get(f"blk.{index}.{leaf}.bias")
            _set(layer, _LINEAR[leaf], StoredLinear(_matrix(fm, t, arch, s, rows8=True),
                                                    None if bias is None else fm.floats(bias)))
        elif leaf in _NORMS:
            norm = _NORMS[leaf]
            module = layer
            for part in norm:
                module = getattr(module, part)
            module.weight = torch.nn.Parameter(fm.floats(t), requires_grad=False)
    embedding = _matrix(fm, tensors["token_embd.weight"], arch, s)
    model.model.embed_tokens = StoredEmbedding(embedding)
    head = tensors.get("output.weight")
    model.lm_head = StoredLinear(embedding if head is None else _matrix(fm, head, arch, s, True))
    model.model.norm.weight = torch.nn.Parameter(fm.floats(tensors["output_norm.weight"]),
                                                 requires_grad=False)
    freqs = tensors.get(ROPE_FREQS)
    rope_frequencies(model, config, None if freqs is None else fm.floats(freqs))
    model.file_map = fm  # the views above keep the map alive; this names who holds it
    left = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if left or (arch in QK_NORMED) != hasattr(layers[0].self_attn, "q_norm"):
        raise GGUFError(f"{Path(header.table.path).name}: the file has no tensor for "
                        f"{left[0] if left else 'the q/k norms'}")
    model.requires_grad_(False)
    return model.eval()


def stored_bytes(model: Any) -> int:
    """Bytes of every stored matrix the model multiplies by (a tied head counted once)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        matrix = getattr(module, "matrix", None)
        if isinstance(matrix, StoredMatrix):
            seen[id(matrix)] = matrix.nbytes
    return sum(seen.values())


def stored_params(model: Any) -> int:
    seen: dict[int, int] = {}
    for module in model.modules():
        matrix = getattr(module, "matrix", None)
        if isinstance(matrix, StoredMatrix):
            seen[id(matrix)] = matrix.rows * matrix.cols
    return sum(seen.values()) + sum(p.numel() for p in model.parameters())
