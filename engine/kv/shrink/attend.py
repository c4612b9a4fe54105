"""The attention a shrinking method runs in place of sdpa (engine/attention.py `overriding`):
softmax(q·kᵀ·scale + mask)·v in float32, as eager attention computes it, a chunk of queries at a
time (a long prompt's full score matrix is never held), with the method's part:

- sparse (topk, indexer), at a decode step: each head's weights kept on its k picked keys and
  renormalized — the same numbers as a softmax over those keys alone;
- eviction: the weights handed to the cache layer (H2O accumulates them, SnapKV keeps its
  window's rows), which then evicts down to its budget.

It also counts the bytes of cache a decode step reads and keeps, for one layer, each head's
attention row at each decode step over every position so far (0 where a key was not attended
or no longer held): what the page's heatmap shows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .evict import EvictLayer
from .sparse import IndexedLayer, indexer_scores, picked_rows, top_k_mask

CHUNK = 256  # queries a score matrix holds at once


def _chunk_mask(attention_mask: torch.Tensor | None, first: int, count: int, t: int, s: int,
                device: torch.device) -> torch.Tensor:
    """bool (…, count, S): which keys queries first .. first + count − 1 (of t) may see."""
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        return attention_mask[..., -t:, -s:][..., first:first + count, :]
    if attention_mask is not None:  # additive float mask
        return attention_mask[..., -t:, -s:][..., first:first + count, :] == 0
    rows = torch.arange(s - t + first, s - t + first + count, device=device)[:, None]
    return torch.arange(s, device=device)[None, :] <= rows


class ShrinkAttention:
    """One run's attention function: `method`, `k` (sparse methods' keys per head), the cache
    whose layers it reads, and the layer whose rows it records."""

    def __init__(self, method: str, cache: Any, kv_heads: int, k: int = 0,
                 record_layer: int | None = None) -> None:
        self.method, self.cache, self.kv_heads, self.k = method, cache, kv_heads, k
        self.record_layer = record_layer
        self.read_bytes = 0  # this forward's, over layers (decode steps only)
        self.rows: list[np.ndarray] = []  # per decode step: (H, positions) float32

    def __call__(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, scaling: float | None) -> tuple[Any, None]:
        layer_index = module.layer_idx
        layer = self.cache.layers[layer_index]
        b, h, t, d = query.shape  # query (B, H, T, D); key, value (B, KVH, S, D)
        kvh, s = key.shape[1], key.shape[2]
        scale = scaling if scaling is not None else d ** -0.5
        keys, values = key.float(), value.float()
        out = []
        for first in range(0, t, CHUNK):
            count = min(CHUNK, t - first)
            q = query[:, :, first:first + count].float().reshape(b, kvh, (h // kvh) * count, d)
            scores = torch.matmul(q, keys.transpose(-1, -2)).view(b, h, count, s) * scale
            allowed = _chunk_mask(attention_mask, first, count, t, s, query.device)
            scores = scores.masked_fill(~allowed, float("-inf"))
            weights = torch.softmax(scores, dim=-1)  # (B, H, c, S)
            if t == 1 and self.method in ("topk", "indexer"):
                weights = self._sparse(weights, scores, query, layer, key, d)
            if isinstance(layer, EvictLayer):
                layer.observe(weights, first, t)
            grouped = weights.reshape(b, kvh, (h // kvh) * count, s)
            out.append(torch.matmul(grouped, values).view(b, h, count, d))
        if t == 1 and isinstance(layer, EvictLayer):
            self.read_bytes += key.nbytes + value.nbytes
        if t == 1 and layer_index == self.record_layer:
            self._record(weights[0, :, 0], layer)
        if isinstance(layer, EvictLayer):
            layer.settle(t)
        return torch.cat(out, dim=2).transpose(1, 2).to(query.dtype), None

    def _sparse(self, weights: torch.Tensor, scores: torch.Tensor, query: torch.Tensor,
                layer: Any, keys: torch.Tensor, d: int) -> torch.Tensor:
        """keys: the cache's own (B, KVH, S, D), in its dtype: what a step reads."""
        row_bytes = d * keys.element_size()
        if self.method == "indexer" and isinstance(layer, IndexedLayer):
            mask = top_k_mask(indexer_scores(query.float(), layer), self.k)
            self.read_bytes += layer.index_keys.nbytes + 2 * picked_rows(mask, self.kv_heads) * row_bytes
        else:
            mask = top_k_mask(scores, self.k)
            self.read_bytes += keys.nbytes + picked_rows(mask, self.kv_heads) * row_bytes
        kept = weights * mask
        return kept / kept.sum(dim=-1, keepdim=True)

    def _record(self, weights: torch.Tensor, layer: Any) -> None:
        """weights (H, S) of the stored keys → (H, positions so far) by each key's position."""
        h, s = weights.shape
        if isinstance(layer, EvictLayer):
            row = torch.zeros(h, layer.seen)
            group = h // self.kv_heads
            where = layer.positions[0].repeat_interleave(group, dim=0)[:, :s]  # (H, S)
            row.scatter_(1, where.cpu(), weights.cpu())
        else:
            row = weights.cpu()
        self.rows.append(row.numpy().astype(np.float32))
