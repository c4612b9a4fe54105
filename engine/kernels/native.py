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

Weights in fewer bits (`weights="int8" | "q8_0" | "q4_0" | "q4_1"`, AWQ copies as their base
format; q8_0, q4_0 and q4_1 are GGML's blocks, engine/quant/ggml_blocks.py):
the step reads the stored codes and float16 scales themselves and unpacks them in registers, so
the bytes it streams per token fall with the bits — the memory-bound lesson, measured. Its
reference is a transformers forward of the same dequantized weights (the variant's copy from
engine.quant.variants), which is also what the prompt's prefill runs on. Each matrix has its
own format, so the K-quant mixes (`q4_k_m`, `q4_k`, `q6_k`: Q4_K, Q6_K, Q5_0, Q8_0 per tensor,
engine/quant/kmix.py) run on their GGML blocks as stored, and so can an opened GGUF file's
tensors (`NativeDecoder(lm, blocks=…)`, native_pack.pack_blocks).

The packed weights are described once, by `native_pack.layout`: packing, sizing and the offsets
the C step reads all come from it. The step can also record what a traced step needs (each
recorded layer's attention row per head, the hidden state entering every layer) into buffers
this class owns, so the live run can use it (engine/runner.py).
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import DynamicCache

from ..cbuild import build, compiler
from ..errors import EngineError, InputError
from ..forward import prefill, timed_greedy
from ..loader import LoadedModel
from ..quant.kmix import K_VARIANTS, tensor_types
from ..quant.variants import WeightReport
from ..settings import FLOAT_DTYPES
from .native_formats import (
    MatrixFormat,
    MatrixFormats,
    format_code,
    format_group,
    formats_from_types,
    uniform_formats,
)
from .native_pack import (
    BLOCK,
    MAX_GROUPS,
    NATIVE_WEIGHTS,
    GgmlBlocks,
    NotOnGrid,
    base_variant,
    layout,
    pack,
    pack_blocks,
    pack_weights,
    stored_matrix,
    variant_blocks,
)

SOURCE = Path(__file__).with_name("native_decode.c")
HEADERS = ("native_groups.h", "native_ggml.h")  # next to SOURCE, which includes them
MAX_HEAD_DIM = 512  # rope() in the C step keeps one head on its stack
NATIVE_VARIANTS = (*NATIVE_WEIGHTS, *K_VARIANTS)  # variant names (base_variant) the step runs
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", f"-DBLOCK={BLOCK}",
         f"-DMAX_HEAD_DIM={MAX_HEAD_DIM}", f"-DMAX_GROUPS={MAX_GROUPS}"]


class Config(ctypes.Structure):
    """Mirror of the C `Config` struct (same field order and types)."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "max_tokens")]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float)]


@dataclass(frozen=True, slots=True, eq=False)
class NativeStep:
    """What one recorded native decode step produced."""

    logits: torch.Tensor  # (V,) float32, a fresh tensor
    attention: torch.Tensor | None  # (L_rec, H, position + 1) float32 softmax rows, or None
    hidden: torch.Tensor | None  # (L + 1, hidden) float32: every layer's input, the last one's output


def _formats(weights: str, model: torch.nn.Module) -> MatrixFormats:
    """Every (layer, matrix)'s format for a weights variant of `model`: one for all layers, or
    (a K-quant mix) the GGML type llama.cpp's rule gives each tensor (kmix.tensor_types)."""
    name, layers = base_variant(weights), model.config.num_hidden_layers
    if name in K_VARIANTS:
        return formats_from_types(tensor_types(name, model), layers)
    if name not in NATIVE_WEIGHTS:
        raise InputError(f"the native step reads {', '.join(NATIVE_VARIANTS)} weights, not "
                         f"{weights!r}")
    return uniform_formats(layers, *NATIVE_WEIGHTS[name])


def _compiler() -> str | None:
    return compiler()


def native_problem(lm: LoadedModel, weights: str = "fp32") -> str | None:
    """Why the native decoder cannot run this model (with these weights) here: one line, or None."""
    cfg = lm.model.config
    if base_variant(weights) not in NATIVE_VARIANTS:
        torch_runs = (f"torch runs the model in {FLOAT_DTYPES[weights]}" if weights in FLOAT_DTYPES
                      else "torch runs this variant on its dequantized float32 weights")
        return (f"the native step reads float32 and integer weights, not {weights} (only "
                f"{', '.join(NATIVE_VARIANTS)}); {torch_runs}")
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
             "q+k+v width": (c.heads + 2 * c.kv_heads) * c.head_dim,
             "query width (heads · head_dim)": c.heads * c.head_dim}
    odd = [name for name, size in sizes.items() if size % BLOCK]
    if odd:
        return f"the native decoder needs sizes in multiples of {BLOCK} ({', '.join(odd)})"
    if max(c.hidden, c.inter, c.heads * c.head_dim) // 32 > MAX_GROUPS:
        return f"the native decoder sums at most {MAX_GROUPS} weight groups per row"
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
    lib = build(SOURCE, HEADERS, FLAGS, "native decoder")
    void_p, int64 = ctypes.c_void_p, ctypes.c_int64
    lib.scratch_floats.argtypes = [ctypes.POINTER(Config)]
    lib.scratch_floats.restype = int64
    lib.decode_step.argtypes = [
        ctypes.POINTER(Config), void_p, ctypes.POINTER(int64),  # config, weights, part offsets
        ctypes.POINTER(int64),  # each part's format and group
        void_p, void_p, void_p, void_p, void_p,  # embedding, cos, sin, key and value caches
        int64, int64, void_p, void_p, ctypes.c_int,  # token, position, scratch, logits, threads
        void_p, void_p, void_p]  # recorded-layer slots, attention rows, hidden states (or NULL)
    lib.decode_step.restype = None
    lib.matvec.argtypes = [void_p, int64, int64, int64, int64, void_p, void_p, ctypes.c_int]
    lib.matvec.restype = None
    return lib


def matvec(weight: torch.Tensor | GgmlBlocks, fmt: MatrixFormat, x: torch.Tensor,
           threads: int = 1) -> torch.Tensor:
    """W x by the step's own kernel for `fmt`: `weight` (n, k) float32 (quantized to `fmt`,
    losslessly, as the packer does) or a matrix's GGML blocks, x (k,) → (n,) float32. Why: each
    format's kernel can be checked against a reference (gguf-py's dequantize) on its own."""
    n, k = weight.shape
    stored = stored_matrix(weight, fmt).contiguous()
    x = x.float().contiguous()
    y = torch.empty(n)
    build_library().matvec(stored.data_ptr(), format_code(fmt), format_group(fmt), n, k,
                           x.data_ptr(), y.data_ptr(), threads)
    return y


def stored_types(blocks: Mapping[str, GgmlBlocks | torch.Tensor]) -> str:
    """What a decoder built on a file's blocks multiplies by, for its decoder line: "the file's
    GGML blocks (Q4_1 ×210, Q8_0 ×1)" — the reader's float32 copy only feeds the prefill."""
    types = Counter(b.type_name for b in blocks.values() if isinstance(b, GgmlBlocks))
    return "the file's GGML blocks (" + ", ".join(f"{k} ×{v}" for k, v in types.most_common()) + ")"


class CachedStep:
    """What a C decode step over its own KV cache does around its `_run` (NativeDecoder here,
    StoredDecoder on a GGUF's blocks): one step, recorded or not; the prompt's K/V from a torch
    prefill; a timed greedy run. A subclass sets config (layers), max_tokens, lm, keys, values,
    logits, attention_rows, hidden_states, and defines `_check` and `_run`."""

    config: Any
    max_tokens: int
    lm: LoadedModel
    keys: torch.Tensor
    values: torch.Tensor
    logits: torch.Tensor
    attention_rows: torch.Tensor
    hidden_states: torch.Tensor

    @property
    def model(self) -> torch.nn.Module:
        """The torch model holding exactly the weights this step multiplies by."""
        return self.lm.model

    def _check(self, token: int, position: int) -> None:
        raise NotImplementedError

    def _run(self, token: int, position: int, slots: ctypes.Array | None, hidden: bool) -> None:
        raise NotImplementedError

    def step_logits(self, token: int, position: int) -> torch.Tensor:
        """One unrecorded decode step: token at `position` → (V,) logits (a buffer the next
        step overwrites); its K/V enters the cache."""
        self._check(token, position)
        self._run(token, position, None, False)
        return self.logits

    def step(self, token: int, position: int, attention_layers: tuple[int, ...] = (),
             hidden: bool = False) -> NativeStep:
        """One decode step that also records the attention rows of `attention_layers` and, with
        `hidden`, the hidden state entering every layer (and the final-normed output)."""
        self._check(token, position)
        c = self.config
        if any(not 0 <= layer < c.layers for layer in attention_layers):
            raise InputError(f"attention layers must be between 0 and {c.layers - 1}")
        if len(set(attention_layers)) != len(attention_layers):  # one slot per layer, ≤ layers
            raise InputError("each attention layer may be asked for once")
        slots = None
        if attention_layers:
            slot_of = {layer: i for i, layer in enumerate(attention_layers)}
            slots = (ctypes.c_int64 * c.layers)(*(slot_of.get(k, -1) for k in range(c.layers)))
        self._run(token, position, slots, hidden)
        rows = self.attention_rows[:len(attention_layers), :, :position + 1].clone()
        return NativeStep(self.logits.clone(), rows if attention_layers else None,
                          self.hidden_states.clone() if hidden else None)

    def load_prefix(self, cache: DynamicCache, n: int) -> None:
        """Copy a torch prefill's K/V of `n` positions into this decoder's cache."""
        if n > self.max_tokens:
            raise InputError(f"{n} positions do not fit the native cache of {self.max_tokens}")
        for i, layer in enumerate(cache.layers):
            self.keys[i, :, :n] = layer.keys[0, :, :n]  # (KVH, S, D)
            self.values[i, :, :n] = layer.values[0, :, :n]

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int]) -> torch.Tensor:
        """The prompt through transformers (on `model`); its K/V copied into this cache.
        Returns (V,) logits."""
        cache = DynamicCache(config=self.model.config)
        logits, _ = prefill(self.model, torch.tensor([prompt_ids]), cache)
        self.load_prefix(cache, len(prompt_ids))
        return logits

    def greedy(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
        """Prefill, then greedy native decode steps; returns the tokens and each step's ms."""
        if len(prompt_ids) + new_tokens > self.max_tokens:
            raise InputError(f"prompt ({len(prompt_ids)}) + new tokens ({new_tokens}) exceed the "
                             f"native cache of {self.max_tokens} tokens")
        return timed_greedy(self.prefill(prompt_ids),
                            lambda token, i: self.step_logits(token, len(prompt_ids) + i),
                            new_tokens, self.lm.device)


class NativeDecoder(CachedStep):
    """Packed weights, a KV cache, scratch memory and the compiled C step for one loaded
    Llama-family model. One step at a time: the cache and the scratch belong to the decoder.

    `weights`: a variant name (NATIVE_WEIGHTS, "int4" = q4_0, "awq_q4_0" runs as q4_0). The
    decoder packs `lm`'s weights when they already lie on the variant's grid (the variant's copy
    from engine.quant.variants; the default model's own weights are on the Q4_1 grid); otherwise
    it makes that copy itself, and keeps it as `model`: the reference its steps equal and what
    the prompt's prefill runs on.

    `blocks`: a GGUF file's tensors by name (native_pack.pack_blocks: GGML block bytes for the
    matrices, float tensors for the norms), packed as stored, each matrix in its own type; then
    `weights` only names them and `lm.model` must hold the same values dequantized (the prefill's
    and the reference's weights); `stored_as` then says which types it reads (None without).
    """

    def __init__(self, lm: LoadedModel, max_tokens: int = 256, weights: str = "fp32",
                 blocks: Mapping[str, GgmlBlocks | torch.Tensor] | None = None) -> None:
        problem = native_problem(lm, "fp32" if blocks is not None else weights)
        if problem:
            raise EngineError(problem)
        self.weights_name = weights
        self.report: WeightReport | None = None  # the variant's bytes, when this decoder made its copy
        self.stored_as = None if blocks is None else stored_types(blocks)
        self.lib = build_library()
        self.config = _config(lm, max_tokens)
        c = self.config
        with torch.inference_mode():
            try:
                if blocks is not None:
                    parts, self.packed = pack_blocks(c, blocks)
                else:
                    parts = layout(c, _formats(weights, lm.model))
                    self.packed = pack_weights(lm.model, parts)
            except NotOnGrid:
                from ..quant.apply import apply_variant

                name = base_variant(weights)
                copy, self.report = apply_variant(lm, name)
                if name in K_VARIANTS:  # the blocks the copy was dequantized from, as they are
                    self.packed = pack(parts, variant_blocks(lm.model, tensor_types(name, lm.model)))
                else:
                    self.packed = pack_weights(copy, parts)
                lm = replace(lm, model=copy)
            self.embed = lm.model.get_input_embeddings().weight.detach().contiguous()
            positions = torch.arange(max_tokens)[None]  # (1, T)
            cos, sin = lm.model.model.rotary_emb(self.embed[:1], position_ids=positions)
        self.lm, self.max_tokens = lm, max_tokens
        self.parts = parts
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # (T, D)
        self.offsets = (ctypes.c_int64 * len(parts))(*(part.offset for part in parts))
        codes = [(format_code(part.fmt), format_group(part.fmt)) for part in parts]
        self.formats = (ctypes.c_int64 * (2 * len(parts)))(*(v for pair in codes for v in pair))
        shape = (c.layers, c.kv_heads, max_tokens, c.head_dim)
        self.keys, self.values = torch.zeros(shape), torch.zeros(shape)
        self.scratch = torch.empty(self.lib.scratch_floats(ctypes.byref(c)))  # one step's buffers
        self.logits = torch.empty(c.vocab)
        self.attention_rows = torch.zeros(c.layers, c.heads, max_tokens)  # (slots, H, T)
        self.hidden_states = torch.zeros(c.layers + 1, c.hidden)  # (L + 1, hidden)
        self.threads = max(1, torch.get_num_threads())

    @property
    def weights(self) -> str:
        return self.weights_name

    @property
    def weight_bytes(self) -> int:
        """Bytes of the packed weights (codes, scales, norms, padding): what one step streams."""
        return self.packed.nbytes

    @property
    def nbytes(self) -> int:
        """Memory this decoder holds: packed weights, embedding table, KV cache, scratch and the
        recording buffers."""
        return sum(t.nbytes for t in (self.packed, self.embed, self.keys, self.values,
                                      self.scratch, self.logits, self.attention_rows,
                                      self.hidden_states))

    def _check(self, token: int, position: int) -> None:
        if not 0 <= position < self.max_tokens:  # the C code trusts its indices: check them here
            raise InputError(f"position {position} is outside the native cache of "
                             f"{self.max_tokens} tokens")
        if not 0 <= token < self.config.vocab:
            raise InputError(f"token id {token} is outside the vocabulary ({self.config.vocab})")

    def _run(self, token: int, position: int, slots: ctypes.Array | None, hidden: bool) -> None:
        self.lib.decode_step(
            ctypes.byref(self.config), self.packed.data_ptr(), self.offsets, self.formats,
            self.embed.data_ptr(), self.cos.data_ptr(), self.sin.data_ptr(), self.keys.data_ptr(),
            self.values.data_ptr(), token, position, self.scratch.data_ptr(),
            self.logits.data_ptr(), self.threads, slots,
            self.attention_rows.data_ptr() if slots is not None else None,
            self.hidden_states.data_ptr() if hidden else None)

