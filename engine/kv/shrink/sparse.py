"""Sparse attention at decode time: each query head attends to `k` of the cached keys.

- Exact top-k: the k keys of highest q·k for each head. It must score every key, so it reads
  all of them, and the values of the keys it picks: it saves reading values only.
- A cheap indexer (the idea of DeepSeek's sparse attention, whose "lightning indexer" is a small
  trained scorer): here untrained, a low-dimensional score — q and k projected onto the keys'
  top principal directions of each layer and KV head (found on the calibration text), an
  `INDEX_FRACTION` of head_dim — picks the k keys, then full attention runs on those. Its
  cache adds the projected keys; a step reads them, and only the picked keys and values.

The cache itself is the full one (these methods shrink what a step reads, not what is held);
with k ≥ the keys cached, both equal dense attention.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from ...loader import LoadedModel
from .latent import calibration

INDEX_FRACTION = 4  # the indexer scores in head_dim / 4 dimensions

_INDEXERS: weakref.WeakKeyDictionary[Any, list[torch.Tensor]] = weakref.WeakKeyDictionary()


def indexer_projections(lm: LoadedModel) -> list[torch.Tensor]:
    """Per layer, P (KVH, D, D / INDEX_FRACTION): each KV head's rotated keys' top principal
    directions on the calibration text (uncentred: q·k is a plain product)."""
    if lm.model not in _INDEXERS:
        found = []
        for _pre, _values, rotated in calibration(lm):  # (T, KVH, D)
            d = rotated.shape[-1]
            per_head = []
            for head in range(rotated.shape[1]):
                _u, _s, vh = torch.linalg.svd(rotated[:, head].double(), full_matrices=True)
                per_head.append(vh[: max(1, d // INDEX_FRACTION)].T.float())  # (D, d')
            found.append(torch.stack(per_head))
        _INDEXERS[lm.model] = found
    return _INDEXERS[lm.model]


class IndexedLayer(DynamicLayer):
    """A full cache that also keeps each key projected for the indexer (B, KVH, S, d')."""

    def __init__(self, projection: torch.Tensor) -> None:
        super().__init__()
        self.projection = projection  # (KVH, D, d')
        self.index_keys: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.projection = self.projection.to(key_states.device, key_states.dtype)
        keys, values = super().update(key_states, value_states)
        projected = torch.einsum("bhtd,hde->bhte", key_states, self.projection)
        self.index_keys = projected if self.index_keys is None else torch.cat(
            [self.index_keys, projected], dim=-2)
        return keys, values


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores (B, H, 1, S) → bool (B, H, 1, S): each head's k highest (all when k ≥ S)."""
    s = scores.shape[-1]
    if k >= s:
        return torch.ones_like(scores, dtype=torch.bool)
    index = scores.topk(k, dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, index, True)


def indexer_scores(query: torch.Tensor, layer: IndexedLayer) -> torch.Tensor:
    """query (B, H, 1, D) → (B, H, 1, S): q·k in the indexer's d' dimensions."""
    b, h, t, d = query.shape
    kvh = layer.projection.shape[0]
    q = query.reshape(b, kvh, (h // kvh) * t, d)
    q_small = torch.einsum("bhtd,hde->bhte", q, layer.projection)  # (B, KVH, G·T, d')
    return torch.matmul(q_small, layer.index_keys.transpose(-1, -2)).view(b, h, t, -1)


def picked_rows(mask: torch.Tensor, kv_heads: int) -> int:
    """Rows of a KV head's cache some of its query heads picked, summed over KV heads (the keys
    or values a step must read): mask (B, H, 1, S)."""
    b, h, t, s = mask.shape
    return int(mask.view(b, kv_heads, (h // kv_heads) * t, s).any(dim=2).sum())
