"""The default model's weights already lie on a 4-bit grid: measured, not asserted.

The default model is read from a Q4_1 GGUF (its decoder Linear weights; the token embedding is
Q8_0, the norms float32). A GGUF reader dequantizes each block of 32 weights along a row as
d · c + m (float16 d and m widened to float32, 4-bit codes c), and the loader keeps those float32
values. So re-quantizing a weight to Q4_1 with the same groups of 32 finds each group's own min
(c = 0) and max (c = 15), the same float16 d and m, and the same codes: it rebuilds the weight
exactly, if the file's quantizer used each block's min and max (llama.cpp's reference Q4_1 does).
Another grid — symmetric (Q4_0), groups of 64, 3 bits — does not contain those values, and
re-quantizing to it moves them. The errors below are measured on the loaded tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .formats import quantize
from .scheme import FORMATS, QuantFormat
from .variants import decoder_linears

_ROWS = 4096  # rows quantized at once (the embedding has 49,152)

# The file's own grid first, then grids it is not on.
LINEAR_GRIDS: tuple[QuantFormat, ...] = (
    FORMATS["q4_1"],
    FORMATS["q4_0"],
    QuantFormat("4-bit + min (group 64)", 4, 64, True),  # our own grid, not GGML's Q4_1
    FORMATS["q3"],
)
# The embedding is Q8_0 in the file: 8-bit symmetric codes, one float16 scale per 32.
EMBEDDING_GRIDS: tuple[QuantFormat, ...] = (FORMATS["q8_0"], QuantFormat("int8 (group 64)", 8, 64, False))


@dataclass(frozen=True, slots=True)
class GridCheck:
    """Re-quantizing some weights to one grid: how far the values move."""

    grid: str
    bits: int
    group: int
    zero_point: bool
    tensors: int
    weights: int
    max_abs_error: float  # max over all weights of |W − deq(q(W))|
    max_abs_weight: float  # max |W|: what the error is read against
    mean_step: float  # mean |d̂| (float16 scale): the grid's spacing
    exact_fraction: float  # share of weights rebuilt bit for bit

    @property
    def lossless(self) -> bool:
        return self.max_abs_error == 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"grid": self.grid, "bits": self.bits, "group": self.group,
                "zero_point": self.zero_point, "tensors": self.tensors, "weights": self.weights,
                "max_abs_error": self.max_abs_error, "max_abs_weight": self.max_abs_weight,
                "mean_step": self.mean_step, "exact_fraction": self.exact_fraction}


@torch.no_grad()
def check_grid(weights: list[torch.Tensor], fmt: QuantFormat) -> GridCheck:
    """Quantize each (out, in) weight to `fmt`, dequantize, and compare with the original."""
    max_err = max_w = step_sum = 0.0
    exact = count = groups = 0
    rows = [part for w in weights for part in w.detach().split(_ROWS, 0)]  # bounded scratch
    for w in rows:
        w32 = w.float()  # (rows, in)
        q = quantize(w32, fmt)
        back = q.dequantize()  # (out, in)
        max_err = max(max_err, float((w32 - back).abs().max()))
        max_w = max(max_w, float(w32.abs().max()))
        exact += int((w32 == back).sum())
        count += w32.numel()
        step_sum += float(q.scales.float().abs().sum())  # Q4_0's d may be < 0
        groups += q.scales.numel()
    group = fmt.group_for(weights[0].shape[1]) if weights else 0
    return GridCheck(fmt.name, fmt.bits, group, fmt.zero_point, len(weights), count, max_err,
                     max_w, step_sum / max(groups, 1), exact / max(count, 1))


def layer_weights(model: Any, layers: list[int] | None = None) -> list[torch.Tensor]:
    """The decoder Linear weights of the given layers (all layers when None)."""
    chosen = []
    for name, module in decoder_linears(model):
        index = int(name.split(".layers.")[1].split(".")[0])
        if layers is None or index in layers:
            chosen.append(module.weight)
    if not chosen:
        raise ValueError(f"no decoder Linear weights in layers {layers}")
    return chosen


def linear_grids(model: Any, layers: list[int] | None = None,
                 grids: tuple[QuantFormat, ...] = LINEAR_GRIDS) -> list[GridCheck]:
    """Each grid checked on the decoder Linear weights (the Q4_1 part of the file)."""
    weights = layer_weights(model, layers)
    return [check_grid(weights, fmt) for fmt in grids]


def embedding_grids(model: Any, grids: tuple[QuantFormat, ...] = EMBEDDING_GRIDS) -> list[GridCheck]:
    """Each grid checked on the token embedding (the Q8_0 part of the file)."""
    table = model.get_input_embeddings().weight  # (vocab, hidden)
    return [check_grid([table], fmt) for fmt in grids]
