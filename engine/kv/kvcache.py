"""The KV cache, measured from its tensors, and variants that shrink it.

- bytes actually held per layer: `engine.forward.cache_layer_bytes` (keys, values and any
  scales), which the recorded run also uses.
- `QuantizedLayer`: keys/values stored as int8 or packed int4 with one float16 scale per cached
  head vector (per token and head, symmetric); attention runs on the dequantized values.
- `SinkWindowLayer`: keeps the first `sinks` positions and the last `window` positions
  (StreamingLLM-style; keys keep the RoPE rotation of their original positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from i18n import N_, _


def quantize(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, H, T, D) → (ints, scales (B, H, T, 1) float16); int4 packs two values a byte."""
    qmax = 2 ** (bits - 1) - 1
    scales = (x.abs().amax(dim=-1, keepdim=True) / qmax).clamp(min=1e-8).to(torch.float16)
    q = torch.round(x / scales.to(x.dtype)).clamp(-qmax - 1, qmax).to(torch.int8)
    if bits == 8:
        return q, scales
    u = (q + 8).to(torch.uint8)  # 0..15
    return u[..., 0::2] | (u[..., 1::2] << 4), scales  # (B, H, T, D/2)


def dequantize(q: torch.Tensor, scales: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    if bits == 4:
        low, high = (q & 0xF).to(torch.int8) - 8, (q >> 4).to(torch.int8) - 8
        q = torch.stack([low, high], dim=-1).flatten(-2)  # (B, H, T, D)
    return q.to(dtype) * scales.to(dtype)


class QuantizedLayer(DynamicLayer):
    def __init__(self, bits: int) -> None:
        super().__init__()
        if bits not in (4, 8):
            raise ValueError("bits must be 4 or 8")
        self.bits = bits
        self.key_scales = self.value_scales = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.dtype = key_states.dtype
        qk, sk = quantize(key_states, self.bits)
        qv, sv = quantize(value_states, self.bits)
        if self.key_scales is None:
            self.keys, self.values, self.key_scales, self.value_scales = qk, qv, sk, sv
        else:
            self.keys = torch.cat([self.keys, qk], dim=-2)
            self.values = torch.cat([self.values, qv], dim=-2)
            self.key_scales = torch.cat([self.key_scales, sk], dim=-2)
            self.value_scales = torch.cat([self.value_scales, sv], dim=-2)
        return (dequantize(self.keys, self.key_scales, self.bits, self.dtype),
                dequantize(self.values, self.value_scales, self.bits, self.dtype))


class SinkWindowLayer(DynamicLayer):
    def __init__(self, window: int, sinks: int = 0) -> None:
        super().__init__()
        self.window, self.sinks, self.cumulative_length = window, sinks, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        keys = torch.cat([self.keys, key_states], dim=-2)  # (B, KVH, S, D)
        values = torch.cat([self.values, value_states], dim=-2)
        if keys.shape[-2] > self.sinks + self.window:
            keep = lambda t: torch.cat([t[..., : self.sinks, :], t[..., -self.window:, :]], -2)  # noqa: E731
            self.keys, self.values = keep(keys), keep(values)
        else:
            self.keys, self.values = keys, values
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        stored = self.keys.shape[-2] if self.is_initialized else 0
        return stored + query_length, 0

    def get_seq_length(self) -> int:
        """Positions seen so far (so RoPE positions keep counting), not positions stored."""
        return self.cumulative_length


# CacheConfig.label of the kinds without a window (translated where shown: the label is never a key)
KIND_LABELS = {"full": N_("full cache"), "int8": N_("int8 cache"), "int4": N_("int4 cache")}


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """full | int8 | int4 | window (with `window` recent tokens and `sinks` first tokens)."""

    kind: str = "full"
    window: int = 0
    sinks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("full", "int8", "int4", "window"):
            raise ValueError(f"unknown cache kind {self.kind!r}")
        if self.kind == "window" and self.window < 1:
            raise ValueError("a sliding window needs window ≥ 1")

    @property
    def label(self) -> str:
        if self.kind == "window":
            if self.sinks:
                return _("window {window} + {sinks} sinks").format(window=self.window, sinks=self.sinks)
            return _("window {window}").format(window=self.window)
        return _(KIND_LABELS[self.kind])


def build_cache(model: Any, config: CacheConfig) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    if config.kind == "full":
        return cache
    layers = model.config.num_hidden_layers
    if config.kind in ("int8", "int4"):
        cache.layers = [QuantizedLayer(int(config.kind[3:])) for _layer in range(layers)]
    else:
        cache.layers = [SinkWindowLayer(config.window, config.sinks) for _layer in range(layers)]
    return cache
