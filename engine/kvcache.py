"""Measuring the KV cache from its tensors (not from a formula)."""

from __future__ import annotations

from typing import Any


def cache_layer_bytes(cache: Any) -> tuple[int, ...]:
    """Bytes held by each layer's key and value tensors (transformers' Cache.layers API)."""
    if cache is None:
        return ()
    sizes = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        size = 0
        for tensor in (keys, values):
            if tensor is not None:
                size += tensor.numel() * tensor.element_size()  # = tensor.nbytes
        sizes.append(size)
    return tuple(sizes)


def cache_length(cache: Any) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0
