"""The serving runner's matrix products: weights packed once for MKL's small-batch GEMM.

A decode step multiplies a few rows (one per request) by every weight matrix. PyTorch's default
float32 path handles 8 rows at well under the speed its memory traffic allows on a CPU; MKL's
packed GEMM (the one PyTorch's own compiler uses for frozen Linear layers) does better, so the
runner packs each weight once (a second copy of the weights, held while the stream runs) and uses
it for every batch size alike — batch 1 and batch 8 are measured on the same path. Where MKL is
absent (other CPUs, CUDA, other dtypes) the module's own weight goes through `F.linear`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

PACK_HINT_ROWS = 8  # the batch size the packing is tuned for; any row count works


def mkl_packing_available(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and hasattr(torch.ops.mkl, "_mkl_linear") and torch.backends.mkl.is_available())


class Linear:
    """y = x · Wᵀ (+ b) for x (…, in), W (out, in) the module's weight."""

    def __init__(self, module: Any) -> None:
        self.weight: torch.Tensor = module.weight
        self.bias: torch.Tensor | None = module.bias
        self.packed = None
        if mkl_packing_available(self.weight):
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, PACK_HINT_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, PACK_HINT_ROWS)
        return F.linear(x, self.weight, self.bias)
