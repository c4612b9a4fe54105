"""A latent KV cache made from the model's own keys and values (MLA-style, no training).

DeepSeek's MLA caches one small latent per token and layer instead of every head's key and
value. A trained model built that way has its latent projection learned; here it is found for a
model that was not (as TransMLA and MHA2MLA start from): the keys before RoPE and the values of
each layer, side by side ([k | v], 2 · KV heads · head_dim numbers per token), are collected on
a calibration text, and their top-r right singular vectors U (2·kvd × r) are the latent basis.

What is cached: c = [k_pre | v] · U, r numbers per token and layer — nothing else.
How attention reads it: by reconstruction, [k̂ | v̂] = c · Uᵀ, then k̂ is rotated to its position
(RoPE kept apart, as MLA and TransMLA do: the latent holds no position, so one basis serves
every position). The "absorbed" form (Uᵀ folded into the query and output projections, no
reconstruction) computes the same numbers faster; the reconstruction is chosen here because it
runs on any llama-family model's stock attention, and the time it costs is measured and said.

At r = 2·kvd, U is square and orthogonal: the reconstruction is the original to float rounding
(a test: next-token probabilities within 1e-4).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...loader import LoadedModel
from ...quant.texts import TEXTS_DIR, read_text

CALIBRATION_TEXT = TEXTS_DIR / "declaration.txt"  # not the held-out text (gettysburg.txt)
CALIBRATION_TOKENS = 512

# model → per layer (k_pre (T, KVH, D), v (T, KVH, D), k_rot (T, KVH, D)) on the calibration text
_SEEN: weakref.WeakKeyDictionary[Any, list[tuple[torch.Tensor, ...]]] = weakref.WeakKeyDictionary()
_BASES: weakref.WeakKeyDictionary[Any, list[torch.Tensor]] = weakref.WeakKeyDictionary()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def positions_cos_sin(model: Any, like: torch.Tensor, start: int, count: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own RoPE tables (frequency factors and scaling included) for positions
    start .. start + count − 1 → cos, sin (1, 1, count, D), broadcast over heads."""
    pos = torch.arange(start, start + count, device=like.device)[None]
    cos, sin = model.model.rotary_emb(like, pos)
    return cos[:, None].to(like.dtype), sin[:, None].to(like.dtype)


def unrotate(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE undone: HF rotates k·cos + rotate_half(k)·sin; its inverse turns by −θ."""
    return k * cos - rotate_half(k) * sin


def rotate(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return k * cos + rotate_half(k) * sin


@torch.inference_mode()
def calibration(lm: LoadedModel) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each layer's keys (before and after RoPE) and values on the calibration text, computed
    once per model: (k_pre, v, k_rot), each (T, KV heads, head_dim) float32."""
    if lm.model not in _SEEN:
        ids = list(lm.tokenizer(read_text(CALIBRATION_TEXT))["input_ids"])[:CALIBRATION_TOKENS]
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([ids], device=lm.device), cache=cache, use_cache=True,
                 logits_to_keep=1)
        seen = []
        for layer in cache.layers:
            keys, values = layer.keys, layer.values  # (1, KVH, T, D)
            cos, sin = positions_cos_sin(lm.model, keys, 0, keys.shape[-2])
            pre = unrotate(keys, cos, sin)
            seen.append(tuple(t[0].transpose(0, 1).float().cpu() for t in (pre, values, keys)))
        _SEEN[lm.model] = seen
    return _SEEN[lm.model]


def latent_bases(lm: LoadedModel) -> list[torch.Tensor]:
    """Per layer, the principal directions of [k_pre | v] on the calibration text, in order of
    the variance they carry (k, 2·kvd) with k = min(calibration tokens, 2·kvd): a rank-r latent's
    Uᵀ is the first r rows."""
    if lm.model not in _BASES:
        bases = []
        for pre, values, _rot in calibration(lm):
            joint = torch.cat([pre.flatten(1), values.flatten(1)], dim=1).double()  # (T, 2·kvd)
            _u, _s, vh = torch.linalg.svd(joint, full_matrices=False)
            bases.append(vh.float().contiguous())
        _BASES[lm.model] = bases
    return _BASES[lm.model]


def basis(directions: torch.Tensor, rank: int) -> torch.Tensor:
    """U (2·kvd, rank) with orthonormal columns: the first `rank` directions, completed (past
    what the calibration text spans) by an orthonormal complement; at full rank a square
    orthogonal matrix, so the latent holds K and V exactly."""
    found, full = directions.shape
    if rank <= found:
        return directions[:rank].T.contiguous()
    q, _r = torch.linalg.qr(torch.cat([directions.T.double(), torch.eye(full, dtype=torch.float64)],
                                      dim=1))
    return q[:, :rank].float().contiguous()


class LatentLayer(DynamicLayer):
    """Caches c = [k_pre | v] · U (B, S, r); hands attention the reconstruction, keys rotated."""

    def __init__(self, model: Any, u: torch.Tensor) -> None:
        super().__init__()
        self.model, self.basis = model, u  # (2·kvd, r)
        self.latent: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        b, kvh, t, d = key_states.shape
        if not self.is_initialized:
            self.device, self.is_initialized = key_states.device, True
            self.basis = self.basis.to(key_states.device, key_states.dtype)
        start = self.get_seq_length()
        cos, sin = positions_cos_sin(self.model, key_states, start, t)
        pre = unrotate(key_states, cos, sin)
        joint = torch.cat([pre.transpose(1, 2).reshape(b, t, kvh * d),
                           value_states.transpose(1, 2).reshape(b, t, kvh * d)], dim=-1)
        latent = joint @ self.basis  # (B, T, r)
        self.latent = latent if self.latent is None else torch.cat([self.latent, latent], dim=1)
        s = self.latent.shape[1]
        rebuilt = self.latent @ self.basis.T  # (B, S, 2·kvd)
        keys = rebuilt[..., :kvh * d].reshape(b, s, kvh, d).transpose(1, 2)
        values = rebuilt[..., kvh * d:].reshape(b, s, kvh, d).transpose(1, 2)
        cos, sin = positions_cos_sin(self.model, key_states, 0, s)
        return rotate(keys, cos, sin), values.contiguous()

    def get_seq_length(self) -> int:
        return 0 if self.latent is None else self.latent.shape[1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


def latent_cache(lm: LoadedModel, rank: int) -> DynamicCache:
    cache = DynamicCache(config=lm.model.config)
    cache.layers = [LatentLayer(lm.model, basis(directions, rank))
                    for directions in latent_bases(lm)]
    return cache


def full_rank(lm: LoadedModel) -> int:
    """2 · KV heads · head_dim: the numbers a token's keys and values hold in one layer."""
    return 2 * lm.spec.kv_heads * lm.spec.head_dim
