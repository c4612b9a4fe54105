"""GGML's K-quants (Q4_K, Q6_K) and Q5_0 as GGML's block bytes (work in progress: API first)."""

from __future__ import annotations

from typing import Any

import torch


def quantize_blocks(weight: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """(out, in) float32 → (out, in / block · block bytes) uint8 in GGML's layout."""
    raise NotImplementedError(ggml_type)


def dequantize_blocks(blocks: torch.Tensor, ggml_type: str, shape: tuple[int, int]) -> torch.Tensor:
    """GGML block bytes → (out, in) float32 as gguf-py's `dequantize` computes them."""
    raise NotImplementedError(ggml_type)


def tensor_types(variant: str, model: Any) -> dict[str, str]:
    """Weight name → GGML type name for every decoder Linear weight and the token embedding."""
    raise NotImplementedError(variant)
