"""The serving runner's matrix products: weights packed once for MKL's small-batch GEMM.

A decode step multiplies a few rows (one per request) by every weight matrix. PyTorch's default
float32 path handles 8 rows at well under the speed its memory traffic allows on a CPU; MKL's
packed GEMM (the one PyTorch's own compiler uses for frozen Linear layers) does better, so the
runner packs each weight once (a second copy of the weights, held while the stream runs) and uses
it for every batch size alike — batch 1 and batch 8 are measured on the same path. Where MKL is
absent (other CPUs, CUDA, other dtypes) the module's own weight goes through `F.linear`. A model
opened from a GGUF file has no float weight to pack: its `StoredLinear` multiplies on the file's
blocks, for every batch size alike, so the runner calls the module itself.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

PACK_HINT_ROWS = 8  # the batch size the packing is tuned for; any row count works


def mkl_packing_available(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and hasattr(torch.ops.mkl, "_mkl_linear") and torch.backends.mkl.is_available())


def has_float_weight(module: Any) -> bool:
    """An nn.Linear-like module with a weight tensor (not a GGUF's stored blocks)."""
    return isinstance(getattr(module, "weight", None), torch.Tensor)


class Linear:
    """y = x · Wᵀ (+ b) for x (…, in), W (out, in) the module's weight — or the module itself
    where it has no float weight (a `StoredLinear`)."""

    def __init__(self, module: Any, pack: bool = True) -> None:
        self.module = None if has_float_weight(module) else module
        self.weight: torch.Tensor | None = None if self.module is not None else module.weight
        self.bias: torch.Tensor | None = module.bias
        self.packed = None
        if pack and self.weight is not None and mkl_packing_available(self.weight):
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, PACK_HINT_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.module is not None:
            return self.module(x)
        if self.packed is not None:
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, PACK_HINT_ROWS)
        return F.linear(x, self.weight, self.bias)
