"""Native decode: a hand-written C decode step for Llama-family models on the CPU.

Why a third way to run the same step: the bytes a decode step must read are fixed (every weight
once), so how close it gets to the memory roof (MBU) is a property of the kernels. Eager PyTorch
calls a library sgemm tuned for many rows with one row, and torch.compile generates its own
kernels; this file's C kernel (engine/kernels/native_decode.c) streams weights packed in 32-row blocks
from huge pages inside one OpenMP region, the way llama.cpp does, and shows how much of the gap
to the roof is software. How close each one gets is measured, not stated here: the Timing page
and bench/engine_bench.py report it for the machine they run on.

Correctness is checked, not assumed: the prompt goes through transformers (prefill), its K/V is
copied into this decoder's cache, and the greedy tokens must equal `model.generate`'s (tests).
The C file is compiled once per machine with the system C compiler (-O3 -march=native -fopenmp)
and loaded with ctypes: no Python headers, no torch headers.

The packed weights are described once, by `layout`: packing, sizing and the offsets the C step
reads all come from it.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import DynamicCache

from ..errors import EngineError, InputError
from ..loader import LoadedModel, cache_root
from ..runner import prefill, timed_greedy
from .microbench import huge_page_buffer

SOURCE = Path(__file__).with_name("native_decode.c")
BLOCK = 32  # rows per packed block: the fastest of 16, 32 and 64 when it was chosen
MAX_HEAD_DIM = 512  # rope() in the C step keeps one head on its stack
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", f"-DBLOCK={BLOCK}",
         f"-DMAX_HEAD_DIM={MAX_HEAD_DIM}"]
LAYER_PARTS = ("in_norm", "qkv", "o", "post_norm", "gate_up", "down")  # the C enum's order
FINAL_PARTS = ("final_norm", "lm_head")


class Config(ctypes.Structure):
    """Mirror of the C `Config` struct (same field order and types)."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "max_tokens")]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float)]


def _compiler() -> str | None:
    return next((c for c in ("gcc", "cc", "clang") if shutil.which(c)), None)


def native_problem(lm: LoadedModel) -> str | None:
    """Why the native decoder cannot run this model here (one line), or None."""
    cfg = lm.model.config
    if lm.device.type != "cpu":
        return "the native decoder is a CPU kernel; this model runs on " + lm.device.type
    if lm.model.dtype != torch.float32:
        return "the native decoder reads float32 weights; load the model in float32"
    if getattr(cfg, "model_type", "") != "llama":
        return f"the native decoder implements the Llama architecture, not {cfg.model_type!r}"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "the native decoder has no bias terms; this model uses them"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"the native decoder implements SiLU, not {cfg.hidden_act!r}"
    rope_type = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if "dynamic" in rope_type or "longrope" in rope_type:
        return f"the native decoder needs fixed rotary frequencies, not {rope_type!r}"
    c = _config(lm, 1)
    sizes = {"hidden size": c.hidden, "intermediate size": c.inter,
             "q+k+v width": (c.heads + 2 * c.kv_heads) * c.head_dim}
    odd = [name for name, size in sizes.items() if size % BLOCK]
    if odd:
        return f"the native decoder needs sizes in multiples of {BLOCK} ({', '.join(odd)})"
    if c.head_dim > MAX_HEAD_DIM or c.head_dim % 2 or c.heads % c.kv_heads:
        return (f"the native decoder needs an even head_dim ≤ {MAX_HEAD_DIM} and query heads in "
                f"whole groups "
                f"per KV head (head_dim {c.head_dim}, {c.heads} / {c.kv_heads} heads)")
    if not _compiler():
        return "the native decoder needs a C compiler with OpenMP (gcc); none was found"
    return None


def _config(lm: LoadedModel, max_tokens: int) -> Config:
    cfg = lm.model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return Config(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, heads=heads,
                  kv_heads=getattr(cfg, "num_key_value_heads", None) or heads, head_dim=head_dim,
                  inter=cfg.intermediate_size, vocab=lm.model.lm_head.weight.shape[0],
                  max_tokens=max_tokens, eps=cfg.rms_norm_eps, scale=head_dim ** -0.5)


def build_library() -> ctypes.CDLL:
    """Compile native_decode.c for this machine (cached by source, flags and CPU) and load it."""
    compiler = _compiler()
    if compiler is None:
        raise EngineError("the native decoder needs a C compiler with OpenMP (gcc); none was found")
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags_line = next((line for line in cpu.splitlines() if line.startswith("flags")), "")
    key = hashlib.sha256("\n".join([SOURCE.read_text(), compiler, *FLAGS, flags_line])
                         .encode()).hexdigest()[:16]
    target = cache_root() / "native" / f"native_decode-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.stem}.{os.getpid()}.tmp")
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(partial), "-lm"],
                              capture_output=True, text=True)
        if done.returncode:
            lines = done.stderr.strip().splitlines() or ["no output"]
            first = next((line for line in lines if "error" in line), lines[0])[:200]
            raise EngineError(f"compiling the native decoder failed: {first}")
        partial.replace(target)
    lib = ctypes.CDLL(str(target))
    void_p, int64 = ctypes.c_void_p, ctypes.c_int64
    lib.scratch_floats.argtypes = [ctypes.POINTER(Config)]
    lib.scratch_floats.restype = int64
    lib.decode_step.argtypes = [
        ctypes.POINTER(Config), void_p, ctypes.POINTER(int64),  # config, weights, part offsets
        void_p, void_p, void_p, void_p, void_p,  # embedding, cos, sin, key and value caches
        int64, int64, void_p, void_p, ctypes.c_int]  # token, position, scratch, logits, threads
    lib.decode_step.restype = None
    return lib


@dataclass(frozen=True, slots=True)
class Part:
    """One tensor of the packed weights: where it starts and the shape it is stored in."""

    name: str  # one of LAYER_PARTS or FINAL_PARTS
    layer: int | None  # None: after the layers
    offset: int  # floats before it in the packed buffer
    shape: tuple[int, ...]

    @property
    def floats(self) -> int:
        return math.prod(self.shape)


def layout(c: Config) -> list[Part]:
    """The packed weights part by part, in buffer order: the one description native_decode.c,
    `pack_weights` and `packed_floats` share.

    Per layer: in_norm (H,) | qkv (Nqkv/B, H, B) | o (H/B, Q, B) | post_norm (H,)
    | gate_up (I/B, 2, H, B) | down (H/B, I, B); then final_norm (H,) | lm_head (Vp/B, H, B).
    B = BLOCK, H = hidden, Q = heads·head_dim, Nqkv = (heads + 2·kv_heads)·head_dim,
    I = intermediate size, Vp = vocab rounded up to B. A matrix (N, K) is stored in B-row blocks,
    k-major (`_blocks`); gate_up puts each block of gate beside the same block of up.
    """
    h, b = c.hidden, BLOCK
    q, nqkv = c.heads * c.head_dim, (c.heads + 2 * c.kv_heads) * c.head_dim
    shapes = {"in_norm": (h,), "qkv": (-(-nqkv // b), h, b), "o": (-(-h // b), q, b),
              "post_norm": (h,), "gate_up": (-(-c.inter // b), 2, h, b),
              "down": (-(-h // b), c.inter, b),
              "final_norm": (h,), "lm_head": (-(-c.vocab // b), h, b)}
    named = [(name, layer) for layer in range(c.layers) for name in LAYER_PARTS]
    named += [(name, None) for name in FINAL_PARTS]
    parts, offset = [], 0
    for name, layer in named:
        parts.append(Part(name, layer, offset, shapes[name]))
        offset += parts[-1].floats
    return parts


def packed_floats(parts: list[Part]) -> int:
    """Size of the packed weights of a `layout` in floats (padding included)."""
    return parts[-1].offset + parts[-1].floats


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) → (ceil(N/B), K, B): each B-row block stored k-major, zero rows as padding."""
    n, k = weight.shape
    if n % BLOCK:
        weight = torch.cat([weight, weight.new_zeros(BLOCK - n % BLOCK, k)])
    return weight.view(-1, BLOCK, k).transpose(1, 2)


def _part_tensors(model: Any) -> Iterator[torch.Tensor]:
    """The model's weights in `layout` order, each in its stored shape."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])  # (Nqkv, H)
        gate, up = _blocks(mlp.gate_proj.weight), _blocks(mlp.up_proj.weight)  # (I/B, H, B)
        yield from (layer.input_layernorm.weight, _blocks(qkv), _blocks(attn.o_proj.weight),
                    layer.post_attention_layernorm.weight, torch.stack([gate, up], dim=1),
                    _blocks(mlp.down_proj.weight))
    yield model.model.norm.weight
    yield _blocks(model.lm_head.weight)


def pack_weights(lm: LoadedModel, parts: list[Part]) -> torch.Tensor:
    """The model's weights at the offsets of `parts` (`layout`), in one huge-page buffer; each
    part must have exactly the shape the layout gives it."""
    buffer = huge_page_buffer(packed_floats(parts))
    tensors = _part_tensors(lm.model)
    for part in parts:
        tensor = next(tensors, None)
        if tensor is None or tuple(tensor.shape) != part.shape:
            where = part.name if part.layer is None else f"layer {part.layer} {part.name}"
            got = "nothing" if tensor is None else f"shape {tuple(tensor.shape)}"
            raise EngineError(f"the native decoder cannot pack {where}: {got}, its layout "
                              f"expects {part.shape}")
        buffer[part.offset:part.offset + part.floats].view(part.shape).copy_(tensor)
    if next(tensors, None) is not None:
        raise EngineError("the native decoder's layout has fewer parts than the model has weights")
    return buffer


class NativeDecoder:
    """Packed weights, a KV cache, scratch memory and the compiled C step for one loaded
    Llama-family model. One step at a time: the cache and the scratch belong to the decoder."""

    def __init__(self, lm: LoadedModel, max_tokens: int = 256) -> None:
        problem = native_problem(lm)
        if problem:
            raise EngineError(problem)
        self.lm, self.max_tokens = lm, max_tokens
        self.lib = build_library()
        self.config = _config(lm, max_tokens)
        c = self.config
        parts = layout(c)
        with torch.inference_mode():
            self.weights = pack_weights(lm, parts)
            self.embed = lm.model.get_input_embeddings().weight.detach().contiguous()
            positions = torch.arange(max_tokens)[None]  # (1, T)
            cos, sin = lm.model.model.rotary_emb(self.embed[:1], position_ids=positions)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # (T, D)
        self.offsets = (ctypes.c_int64 * len(parts))(*(part.offset for part in parts))
        shape = (c.layers, c.kv_heads, max_tokens, c.head_dim)
        self.keys, self.values = torch.zeros(shape), torch.zeros(shape)
        self.scratch = torch.empty(self.lib.scratch_floats(ctypes.byref(c)))  # one step's buffers
        self.logits = torch.empty(c.vocab)
        self.threads = max(1, torch.get_num_threads())

    @property
    def weight_bytes(self) -> int:
        """Bytes of the packed weights (padding included): what one step streams."""
        return self.weights.nbytes

    @property
    def nbytes(self) -> int:
        """Memory this decoder holds: packed weights, its KV cache and its scratch."""
        return (self.weights.nbytes + self.keys.nbytes + self.values.nbytes
                + self.scratch.nbytes + self.logits.nbytes)

    def step(self, token: int, position: int) -> torch.Tensor:
        """One decode step: token at `position` → (V,) logits; its K/V enters the cache."""
        if not 0 <= position < self.max_tokens:  # the C code trusts its indices: check them here
            raise InputError(f"position {position} is outside the native cache of "
                             f"{self.max_tokens} tokens")
        if not 0 <= token < self.config.vocab:
            raise InputError(f"token id {token} is outside the vocabulary ({self.config.vocab})")
        self.lib.decode_step(
            ctypes.byref(self.config), self.weights.data_ptr(), self.offsets,
            self.embed.data_ptr(), self.cos.data_ptr(), self.sin.data_ptr(), self.keys.data_ptr(),
            self.values.data_ptr(), token, position, self.scratch.data_ptr(),
            self.logits.data_ptr(), self.threads)
        return self.logits

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int]) -> torch.Tensor:
        """The prompt through transformers; its K/V copied into this cache. Returns (V,) logits."""
        cache = DynamicCache(config=self.lm.model.config)
        logits, _ = prefill(self.lm.model, torch.tensor([prompt_ids]), cache)
        n = len(prompt_ids)
        for i, layer in enumerate(cache.layers):
            self.keys[i, :, :n] = layer.keys[0]  # (KVH, S, D)
            self.values[i, :, :n] = layer.values[0]
        return logits

    def greedy(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
        """Prefill, then greedy native decode steps; returns the tokens and each step's ms."""
        if len(prompt_ids) + new_tokens > self.max_tokens:
            raise InputError(f"prompt ({len(prompt_ids)}) + new tokens ({new_tokens}) exceed the "
                             f"native cache of {self.max_tokens} tokens")
        return timed_greedy(self.prefill(prompt_ids),
                            lambda token, i: self.step(token, len(prompt_ids) + i),
                            new_tokens, self.lm.device)
