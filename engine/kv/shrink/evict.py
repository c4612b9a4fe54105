"""Eviction: a cache that keeps a budget of tokens, chosen per KV head by a score.

The scores are those of the published methods, written as kvpress writes them (NVIDIA's library
of KV-cache "presses"; tests/test_kv_shrink_kvpress.py checks these functions pick the same
tokens as kvpress's own on the same tensors — kvpress 0.5.5 pins transformers < 5.3, so it is
not a dependency of this app):

- H2O (heavy hitters): the attention each cached token has received so far, summed over the
  queries and the query heads that share its KV head; the most recent half of the budget is
  always kept (H2O's split of heavy hitters and recent tokens). Evicts at every step.
- SnapKV: the attention the prompt's last `window` queries pay each earlier token, averaged
  over those queries, smoothed by an average pool of 5, averaged over a KV head's query heads;
  the window itself is kept (64 queries as kvpress, at most half the prompt and half the
  budget). Compresses the prompt once, after the prefill.
- StreamingLLM: the first SINKS tokens and the most recent ones. Evicts at every step.
- Key norm: the keys of smallest L2 norm (kvpress's KnormPress). Compresses the prompt once.

Every method sees the whole prompt during the prefill (as kvpress's presses: compression
follows the prompt's forward) and keeps RoPE as the keys were rotated at their positions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from .budget import SINKS

SNAPKV_WINDOW = 64  # kvpress's default observation window; smaller when the prompt is short
SNAPKV_KERNEL = 5


def snapkv_scores(window_weights: torch.Tensor, kv_heads: int, kernel: int = SNAPKV_KERNEL
                  ) -> torch.Tensor:
    """window_weights (B, H, W, S): the last W prompt queries' softmax over all S keys →
    (B, KVH, S) scores, the window's own W keys above every other (kvpress 0.5.5: max + 1)."""
    b, h, w, s = window_weights.shape
    scores = window_weights[..., : s - w].mean(dim=-2)  # (B, H, S − W)
    scores = F.avg_pool1d(scores, kernel_size=kernel, padding=kernel // 2, stride=1)
    scores = scores.view(b, kv_heads, h // kv_heads, s - w).mean(2)
    return F.pad(scores, (0, w), value=(scores.max().item() if scores.numel() else 0.0) + 1)


def knorm_scores(keys: torch.Tensor) -> torch.Tensor:
    """keys (B, KVH, S, D) → (B, KVH, S): higher for keys of smaller norm."""
    return -keys.float().norm(dim=-1)


def window_scores(keys: torch.Tensor, kept: int, sinks: int = SINKS) -> torch.Tensor:
    """1 for the first `sinks` and the last `kept − sinks` positions, 0 between."""
    s = keys.shape[-2]
    scores = torch.ones_like(keys[..., 0], dtype=torch.float32)
    scores[..., sinks: sinks + max(0, s - kept)] = 0
    return scores


def keep_top(scores: torch.Tensor, kept: int) -> torch.Tensor:
    """(B, KVH, S) → indices (B, KVH, kept) of the highest scores, in position order."""
    return scores.topk(kept, dim=-1).indices.sort(dim=-1).values


class EvictLayer(DynamicLayer):
    """Holds at most `budget` tokens per KV head (prompt methods: after the prefill)."""

    def __init__(self, method: str, budget: int, kv_heads: int) -> None:
        super().__init__()
        self.method, self.budget, self.kv_heads = method, budget, kv_heads
        self.seen = 0  # positions so far (RoPE keeps counting past evicted tokens)
        self.positions: torch.Tensor | None = None  # (B, KVH, S) each kept token's position
        self.heavy: torch.Tensor | None = None  # (B, KVH, S) H2O's accumulated attention
        self.window_rows: list[torch.Tensor] = []  # SnapKV: the prefill's last queries' weights

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        b, kvh, t, _d = key_states.shape
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.positions = torch.empty(b, kvh, 0, dtype=torch.long, device=key_states.device)
            self.heavy = torch.empty(b, kvh, 0, device=key_states.device)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        new = torch.arange(self.seen, self.seen + t, device=key_states.device)
        self.positions = torch.cat([self.positions, new.expand(b, kvh, t)], dim=-1)
        self.heavy = torch.cat([self.heavy, self.heavy.new_zeros(b, kvh, t)], dim=-1)
        self.seen += t
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        stored = self.keys.shape[-2] if self.is_initialized else 0
        return stored + query_length, 0

    def observe(self, weights: torch.Tensor, first: int, total: int) -> None:
        """Queries first .. first + t − 1 of this forward's `total` attended with weights
        (B, H, t, S) float32: what H2O accumulates and SnapKV's window keeps."""
        b, h, t, s = weights.shape
        if self.method == "h2o":
            self.heavy += weights.view(b, self.kv_heads, h // self.kv_heads, t, s).sum((2, 3))
        elif self.method == "snapkv" and total > 1:
            window = snapkv_window(total, self.budget)
            lo = max(first, total - window)
            if lo < first + t:
                self.window_rows.append(weights[:, :, lo - first:])

    def settle(self, query_length: int) -> None:
        """After a layer's attention: evict down to the budget where the method says so."""
        s = self.keys.shape[-2]
        if s <= self.budget:
            self.window_rows = []
            return
        if self.method == "h2o":
            recent = self.budget // 2
            scores = self.heavy.clone()
            scores[..., s - recent:] = float("inf")
        elif self.method == "window":
            scores = window_scores(self.keys, self.budget)
        elif query_length == 1:  # prompt methods compress once, after the prefill
            return
        elif self.method == "snapkv":
            scores = snapkv_scores(torch.cat(self.window_rows, dim=2), self.kv_heads)
            self.window_rows = []
        else:
            scores = knorm_scores(self.keys)
        self.keep(keep_top(scores, self.budget))

    def keep(self, index: torch.Tensor) -> None:
        """index (B, KVH, n): the positions kept of what is stored."""
        wide = index[..., None].expand(-1, -1, -1, self.keys.shape[-1])
        self.keys = self.keys.gather(2, wide).contiguous()
        self.values = self.values.gather(2, wide).contiguous()
        self.positions = self.positions.gather(2, index)
        self.heavy = self.heavy.gather(2, index)


def snapkv_window(prompt_tokens: int, budget: int) -> int:
    """kvpress's 64, or less: at most half the prompt (kvpress needs the prompt longer than its
    window) and half the budget (a window as large as the budget would leave no room for the
    tokens it is there to choose)."""
    return max(1, min(SNAPKV_WINDOW, prompt_tokens // 2, budget // 2))
