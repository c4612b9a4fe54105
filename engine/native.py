"""Native decode: a hand-written C decode step for Llama-family models on the CPU.

Why a third way to run the same step: the bytes a decode step must read are fixed (every weight
once), so how close it gets to the memory roof (MBU) is a property of the kernels. Eager PyTorch
reaches 0.11–0.19 of this machine's bandwidth (MKL's one-row sgemm), torch.compile 0.4–0.6; this file's
C kernel (engine/native_decode.c) streams weights packed in 32-row blocks from huge pages inside
one OpenMP region, the way llama.cpp does, and shows how much of the gap is software.

Correctness is checked, not assumed: the prompt goes through transformers (prefill), its K/V is
copied into this decoder's cache, and the greedy tokens must equal `model.generate`'s (tests).
The C file is compiled once per machine with the system C compiler (-O3 -march=native -fopenmp)
and loaded with ctypes: no Python headers, no torch headers, a second or two to build.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch
from transformers import DynamicCache

from .errors import EngineError, InputError
from .loader import LoadedModel, cache_root
from .microbench import huge_page_buffer
from .runner import prefill, timed_greedy

SOURCE = Path(__file__).with_name("native_decode.c")
BLOCK = 32  # rows per packed block: measured 15.1 ms/token vs 16.6 (64 rows) and 17.5 (16 rows)
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", f"-DBLOCK={BLOCK}"]


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
    if c.head_dim > 512 or c.head_dim % 2 or c.heads % c.kv_heads:
        return (f"the native decoder needs an even head_dim ≤ 512 and query heads in whole groups "
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
    lib.packed_floats.argtypes = [ctypes.POINTER(Config)]
    lib.packed_floats.restype = ctypes.c_int64
    lib.decode_step.restype = ctypes.c_int
    return lib


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) → (ceil(N/B), K, B): each B-row block stored k-major, zero rows as padding."""
    n, k = weight.shape
    if n % BLOCK:
        weight = torch.cat([weight, weight.new_zeros(BLOCK - n % BLOCK, k)])
    return weight.view(-1, BLOCK, k).transpose(1, 2)


def pack_weights(lm: LoadedModel, c: Config, floats: int) -> torch.Tensor:
    """The layout native_decode.c expects (its header comment), in one huge-page buffer."""
    model = lm.model
    parts: list[torch.Tensor] = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        gate, up = _blocks(mlp.gate_proj.weight), _blocks(mlp.up_proj.weight)  # (I/B, H, B)
        parts += [layer.input_layernorm.weight, _blocks(qkv), _blocks(attn.o_proj.weight),
                  layer.post_attention_layernorm.weight, torch.stack([gate, up], dim=1),
                  _blocks(mlp.down_proj.weight)]
    parts += [model.model.norm.weight, _blocks(model.lm_head.weight)]
    buffer = huge_page_buffer(floats)
    offset = 0
    for part in parts:
        flat = part.reshape(-1)
        buffer[offset:offset + flat.numel()].copy_(flat)
        offset += flat.numel()
    if offset != floats:
        raise EngineError(f"packed {offset} floats, the C layout expects {floats}")
    return buffer


class NativeDecoder:
    """Packed weights, a KV cache and the compiled C step for one loaded Llama-family model."""

    def __init__(self, lm: LoadedModel, max_tokens: int = 256) -> None:
        problem = native_problem(lm)
        if problem:
            raise EngineError(problem)
        self.lm, self.max_tokens = lm, max_tokens
        self.lib = build_library()
        self.config = _config(lm, max_tokens)
        c = self.config
        with torch.inference_mode():
            self.weights = pack_weights(lm, c, self.lib.packed_floats(ctypes.byref(c)))
            self.embed = lm.model.get_input_embeddings().weight.detach().contiguous()
            positions = torch.arange(max_tokens)[None]  # (1, T)
            cos, sin = lm.model.model.rotary_emb(self.embed[:1], position_ids=positions)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # (T, D)
        shape = (c.layers, c.kv_heads, max_tokens, c.head_dim)
        self.keys, self.values = torch.zeros(shape), torch.zeros(shape)
        self.logits = torch.empty(-(-c.vocab // BLOCK) * BLOCK)
        self.threads = max(1, torch.get_num_threads())

    @property
    def weight_bytes(self) -> int:
        """Bytes of the packed weights (padding included): what one step streams."""
        return self.weights.nbytes

    @property
    def nbytes(self) -> int:
        """Memory this decoder holds: packed weights and its KV cache."""
        return self.weights.nbytes + self.keys.nbytes + self.values.nbytes

    def step(self, token: int, position: int) -> torch.Tensor:
        """One decode step: token at `position` → (V,) logits; its K/V enters the cache."""
        if not 0 <= position < self.max_tokens:  # the C code trusts its indices: check them here
            raise InputError(f"position {position} is outside the native cache of "
                             f"{self.max_tokens} tokens")
        if not 0 <= token < self.config.vocab:
            raise InputError(f"token id {token} is outside the vocabulary ({self.config.vocab})")
        ptr = ctypes.c_void_p
        failed = self.lib.decode_step(
            ctypes.byref(self.config), ptr(self.weights.data_ptr()), ptr(self.embed.data_ptr()),
            ptr(self.cos.data_ptr()), ptr(self.sin.data_ptr()), ptr(self.keys.data_ptr()),
            ptr(self.values.data_ptr()), ctypes.c_int64(token), ctypes.c_int64(position),
            ptr(self.logits.data_ptr()), ctypes.c_int(self.threads))
        if failed:
            raise EngineError("the native decoder could not allocate its scratch memory")
        return self.logits[:self.config.vocab]

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
