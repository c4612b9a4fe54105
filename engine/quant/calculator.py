"""Weight bytes for any parameter count and format: the explainer's arithmetic, and what the
per-group scales add to it.

Ideal: params × bits / 8 — the explainer's table (7B parameters: 28 / 14 / 7 / 3.5 GB in
fp32 / fp16 / int8 / int4, GB = 10^9 bytes). Stored: every group of weights also keeps a float16
scale (and a float16 minimum with a zero point), so a format costs bits + 16/group (or 32/group)
bits per weight: Q4_0 (group 32) 4.5, Q4_1 5.0, int8 per output channel 8 + 16/in_features.
These are the same `scheme` definitions the quantizer stores, so the variants' measured bytes
can be checked against this formula (engine/quant/variants.py).

Torch-free: a page can draw the table without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..assets import asset
from .scheme import FORMATS, SCALE_BITS

GB = 1e9  # the explainer's unit: 10^9 bytes

# Bits per weight with no scales: the explainer's table and the float variants.
IDEAL_BITS: dict[str, int] = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4,
                              "int3": 3, "int2": 2}
EXPLAINER_FORMATS = ("fp32", "fp16", "int8", "int4")
GROUP_SIZES = (16, 32, 64, 128)


def ideal_bytes(params: float, bits: float) -> float:
    """params × bits / 8: every weight stored in `bits` bits and nothing else."""
    if params < 0 or bits <= 0:
        raise ValueError("the parameter count must be ≥ 0 and bits per weight > 0")
    return params * bits / 8


def format_bits(name: str, in_features: int | None = None) -> float:
    """Stored bits per weight of a named format, scales included: IDEAL_BITS for the float
    types, bits + group_bits / group for the quantized ones (int8 per channel needs the row
    length, in_features)."""
    if name in FORMATS:
        return FORMATS[name].bits_per_weight(in_features)
    if name in ("fp32", "fp16", "bf16"):
        return float(IDEAL_BITS[name])
    known = ", ".join([*("fp32", "fp16", "bf16"), *FORMATS])
    raise ValueError(f"unknown weight format {name!r}: one of {known}")


def stored_bytes(params: float, name: str, in_features: int | None = None) -> float:
    """params × (bits + overhead bits) / 8 for a named format."""
    return ideal_bytes(params, format_bits(name, in_features))


def explainer_table(params: float = 7e9) -> list[tuple[str, float]]:
    """(format, GB) for fp32 / fp16 / int8 / int4 with no scale overhead, as the explainer
    states it: 7e9 parameters → 28 / 14 / 7 / 3.5 GB."""
    return [(name, ideal_bytes(params, IDEAL_BITS[name]) / GB) for name in EXPLAINER_FORMATS]


@dataclass(frozen=True, slots=True)
class GroupOverhead:
    group: int
    scale_only_bits: float  # 16 / group: one float16 scale per group (Q4_0 idea)
    with_zero_bits: float  # 32 / group: float16 scale + float16 minimum (Q4_1 idea)

    def bits_per_weight(self, code_bits: int, zero_point: bool) -> float:
        return code_bits + (self.with_zero_bits if zero_point else self.scale_only_bits)


def group_overhead(groups: tuple[int, ...] = GROUP_SIZES) -> list[GroupOverhead]:
    """What the scales add per weight, for each group size: smaller groups follow the weights
    more closely and cost more bits."""
    if any(g <= 0 for g in groups):
        raise ValueError("group sizes must be positive")
    return [GroupOverhead(g, SCALE_BITS / g, 2 * SCALE_BITS / g) for g in groups]


def llama_param_count(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
                      head_dim: int, vocab: int, tied_embeddings: bool) -> int:
    """Parameters of a Llama-style decoder from its config: per layer q and o (hidden ×
    heads·head_dim each), k and v (hidden × kv_heads·head_dim each), gate / up / down (hidden ×
    intermediate each) and two RMSNorm vectors; the embedding (vocab × hidden), an untied LM
    head of the same size, and the final norm. No biases (Llama, Mistral, SmolLM2)."""
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden
    embeddings = vocab * hidden * (1 if tied_embeddings else 2)
    return layers * per_layer + embeddings + hidden


@dataclass(frozen=True, slots=True)
class ModelWeights:
    name: str
    params: int
    source: str
    gigabytes: dict[str, float]  # format → GB, ideal for fp32/fp16/bf16, with scales otherwise


def model_weights(name: str, params: int, source: str = "", in_features: int | None = None,
                  formats: tuple[str, ...] = ("fp32", "fp16", "int8", "q4_0", "q4_1", "q3", "q2")
                  ) -> ModelWeights:
    """One model's weight GB in each format. `in_features` (the hidden size) is needed only for
    int8 per channel; without it int8 is counted with no scales."""
    if params <= 0:
        raise ValueError(f"{name}: the parameter count must be positive")
    gb = {}
    for fmt in formats:
        if fmt == "int8" and in_features is None:
            gb[fmt] = ideal_bytes(params, 8) / GB
        else:
            gb[fmt] = stored_bytes(params, fmt, in_features) / GB
    return ModelWeights(name, params, source, gb)


def cited_models(param_counts: dict[str, int], path: Path | None = None) -> list[ModelWeights]:
    """The configs cited in assets/kv_models.json. They record attention shapes only (no hidden
    size, FFN size or vocabulary), so their parameter counts cannot be derived from the file:
    the caller gives each one (`param_counts[name]`); a model without one is left out."""
    from ..kv.kvcalc import load_models  # here: kvcalc imports the spec, hence torch

    models = load_models(path or default_models_path())
    return [model_weights(m.name, param_counts[m.name], m.source)
            for m in models if m.name in param_counts]


def default_models_path() -> Path:
    return asset("kv_models.json")
