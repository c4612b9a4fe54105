"""The serving runner's matrix products: weights packed once for MKL's small-batch GEMM.

A decode step multiplies a few rows (one per request) by every weight matrix. PyTorch's default
float32 path handles 8 rows at well under the speed its memory traffic allows on a CPU; MKL's
packed GEMM (the one PyTorch's own compiler uses for frozen Linear layers) does better, so the
runner packs each weight once, for every batch size alike — batch 1 and batch 8 are measured on
the same path. q/k/v and gate/up are concatenated into one matrix each (as vLLM's
QKVParallelLinear / MergedColumnParallelLinear do): one product instead of three or two. Where MKL
is absent (other CPUs, CUDA, other dtypes) the same concatenated weights go through `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACK_HINT_ROWS = 8  # the batch size the packing is tuned for; any row count works


def mkl_packing_available(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and hasattr(torch.ops.mkl, "_mkl_linear") and torch.backends.mkl.is_available())


class Linear:
    """y = x · Wᵀ (+ b) for x (…, in); W (out, in) is the concatenation of `weights`."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> None:
        weight = torch.cat(weights).contiguous() if len(weights) > 1 else weights[0]
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else weight.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])
        self.weight = weight
        self.splits = [w.shape[0] for w in weights]
        self.packed = None
        if mkl_packing_available(weight):
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_HINT_ROWS)

    @property
    def nbytes(self) -> int:
        """Bytes of the weights this product reads (the packed copy holds the same values)."""
        return self.weight.nbytes + (0 if self.bias is None else self.bias.nbytes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, PACK_HINT_ROWS)
        return F.linear(x, self.weight, self.bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self(x).split(self.splits, dim=-1))
