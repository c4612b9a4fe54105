"""The decode step of a model opened from a GGUF, in C, on the file's mapped blocks.

Why a whole step in C when `StoredLinear` already multiplies on the blocks: a transformers
forward of one token dispatches some twenty torch operations a layer from Python, which on an
8B model's 32 layers costs as much as a few of the matrix products themselves; the C step
(engine/gguf/stored_step.h) runs every layer inside one OpenMP region and reads each matrix where
the file's mapping holds it — the same blocks, the same 8-bit-activation kernels as the prompt's
products — so a step costs what streaming the weights costs. It plugs into the recorded run as
`NativeDecoder` does (engine/runner.py's DecodeStep): the prompt runs in transformers on `model`
(the mapped model, its linear layers on the same blocks), `load_prefix` copies its K/V in, then
each step records the attention rows and hidden states the run asks for.

Correctness is checked, not assumed: the step's logits against a transformers forward of the
mapped model (tests/test_gguf_mapped.py), and the greedy tokens against it.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from typing import Any

import torch

from ..errors import EngineError, InputError
from ..gguf.stored import StoredEmbedding, StoredLinear, library
from ..loader import LoadedModel, is_mapped_model
from .native import CachedStep

PARTS = 14  # stored_step.h: per layer in_norm, q, k, v, o, post_norm, gate, up, down, bq, bk, bv,
# q_norm, k_norm; then final_norm, lm_head, embedding
_LINEARS = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"),
            ("self_attn", "o_proj"))
_MLP = (("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))


class StepConfig(ctypes.Structure):
    """Mirror of stored_step.h's StepConfig."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "max_tokens")]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float)]


def is_mapped(lm: LoadedModel) -> bool:
    """Whether `lm` runs on a GGUF file's mapped blocks (engine/gguf/mapped.py)."""
    return is_mapped_model(lm.model)


def stored_problem(lm: LoadedModel) -> str | None:
    """Why the C step cannot decode this mapped model (one line), or None."""
    cfg = lm.model.config
    if lm.device.type != "cpu":
        return "the stored-blocks step is a CPU kernel; this model runs on " + lm.device.type
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"the stored-blocks step implements SiLU, not {cfg.hidden_act!r}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        window = cfg.sliding_window
        return (f"the model attends within a sliding window of {window} positions; the "
                "stored-blocks step attends to all (torch decodes it)")
    return None


def _floats(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


class StoredDecoder(CachedStep):
    """A KV cache, scratch memory and the C step over a mapped model's blocks. One step at a
    time: the cache and the scratch belong to the decoder."""

    def __init__(self, lm: LoadedModel, max_tokens: int = 256) -> None:
        if not is_mapped(lm):
            raise EngineError("the stored-blocks step runs a model opened from a GGUF file")
        problem = stored_problem(lm)
        if problem:
            raise EngineError(problem)
        self.lm, self.max_tokens = lm, max_tokens
        self.lib = library()
        _declare(self.lib)
        m, cfg = lm.model, lm.model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        self.config = StepConfig(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, heads=heads,
                                 kv_heads=kv_heads, head_dim=head_dim,
                                 inter=cfg.intermediate_size, vocab=m.lm_head.out_features,
                                 max_tokens=max_tokens, eps=cfg.rms_norm_eps,
                                 scale=head_dim ** -0.5)
        self._keep: list[torch.Tensor] = []  # float32 norms and biases the pointers point into
        pointers, types = [], []
        for layer in m.model.layers:
            attn = layer.self_attn
            parts: list[Any] = [layer.input_layernorm.weight]
            parts += [getattr(getattr(layer, a), b) for a, b in _LINEARS]
            parts += [layer.post_attention_layernorm.weight]
            parts += [getattr(getattr(layer, a), b) for a, b in _MLP]
            parts += [getattr(attn, n).bias for n in ("q_proj", "k_proj", "v_proj")]
            parts += [getattr(getattr(attn, n, None), "weight", None) for n in ("q_norm", "k_norm")]
            for part in parts:
                self._add(part, pointers, types)
        embed = m.model.embed_tokens
        if not isinstance(embed, StoredEmbedding):
            raise EngineError("the stored-blocks step needs the file's embedding table")
        for part in (m.model.norm.weight, m.lm_head, embed):
            self._add(part, pointers, types)
        self.pointers = (ctypes.c_void_p * len(pointers))(*pointers)
        self.types = (ctypes.c_int64 * len(types))(*types)
        with torch.inference_mode():
            positions = torch.arange(max_tokens)[None]  # (1, T)
            probe = torch.zeros(1, 1, cfg.hidden_size)
            cos, sin = m.model.rotary_emb(probe, position_ids=positions)
        self.cos, self.sin = cos[0].float().contiguous(), sin[0].float().contiguous()  # (T, D)
        c = self.config
        shape = (c.layers, c.kv_heads, max_tokens, c.head_dim)
        self.keys, self.values = torch.zeros(shape), torch.zeros(shape)
        self.scratch = torch.empty(self.lib.step_scratch_floats(ctypes.byref(c)))
        widest = max(c.hidden, c.inter, c.heads * c.head_dim)
        self.act = torch.empty(self.lib.act_bytes(widest), dtype=torch.uint8)
        self.logits = torch.empty(c.vocab)
        self.attention_rows = torch.zeros(c.layers, c.heads, max_tokens)  # (slots, H, T)
        self.hidden_states = torch.zeros(c.layers + 1, c.hidden)  # (L + 1, hidden)
        self.threads = max(1, torch.get_num_threads())
        matrices = {id(x.matrix): x.matrix for x in m.modules()
                    if isinstance(x, (StoredLinear, StoredEmbedding))}
        table = embed.matrix  # an untied embedding is read for one row a step, not streamed
        tied = table is m.lm_head.matrix
        self._bytes = sum(x.nbytes for x in matrices.values()) - (
            0 if tied else table.nbytes - table.row_bytes)
        self.streamed = [(x.address, x.nbytes) for x in matrices.values()
                         if tied or x is not table]  # what a step reads whole
        self.stored_as = "the file's GGML blocks (" + ", ".join(
            f"{k} ×{v}" for k, v in Counter(x.type_name for x in matrices.values()).most_common()
        ) + ")"

    def _add(self, part: Any, pointers: list[int | None], types: list[int]) -> None:
        if isinstance(part, (StoredLinear, StoredEmbedding)):
            pointers.append(part.matrix.address)
            types.append(part.matrix.code)
        elif part is None:
            pointers.append(None)
            types.append(0)
        else:
            floats = _floats(part)
            self._keep.append(floats)
            pointers.append(floats.data_ptr())
            types.append(0)

    @property
    def weights(self) -> str:
        return "fp32"  # the weights as loaded: the file's own blocks

    @property
    def weight_bytes(self) -> int:
        """Bytes of the stored matrices a step reads: every matrix once, an untied embedding
        table for its one row (tied, it is the LM head and is read whole)."""
        return self._bytes

    @property
    def nbytes(self) -> int:
        """Memory this decoder holds besides the mapped file: cache, scratch, recording."""
        return sum(t.nbytes for t in (self.keys, self.values, self.scratch, self.act, self.logits,
                                      self.attention_rows, self.hidden_states, *self._keep))

    def _check(self, token: int, position: int) -> None:
        if not 0 <= position < self.max_tokens:
            raise InputError(f"position {position} is outside the native cache of "
                             f"{self.max_tokens} tokens")
        if not 0 <= token < self.lm.model.model.embed_tokens.num_embeddings:
            raise InputError(f"token id {token} is outside the vocabulary")

    def _run(self, token: int, position: int, slots: ctypes.Array | None, hidden: bool) -> None:
        self.lib.stored_step(
            ctypes.byref(self.config), self.pointers, self.types, self.cos.data_ptr(),
            self.sin.data_ptr(), self.keys.data_ptr(), self.values.data_ptr(), token, position,
            self.scratch.data_ptr(), self.act.data_ptr(), self.logits.data_ptr(), self.threads,
            slots, self.attention_rows.data_ptr() if slots is not None else None,
            self.hidden_states.data_ptr() if hidden else None)


def _declare(lib: ctypes.CDLL) -> None:
    void_p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.step_scratch_floats.argtypes = [ctypes.POINTER(StepConfig)]
    lib.step_scratch_floats.restype = i64
    lib.stored_step.argtypes = [
        ctypes.POINTER(StepConfig), void_p, void_p,  # config, part pointers, part types
        void_p, void_p, void_p, void_p,  # cos, sin, key and value caches
        i64, i64, void_p, void_p, void_p, ctypes.c_int,  # token, position, scratch, act, logits, threads
        void_p, void_p, void_p]  # recorded-layer slots, attention rows, hidden states (or NULL)
    lib.stored_step.restype = None
