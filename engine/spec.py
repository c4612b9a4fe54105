"""ModelSpec: the architecture numbers every formula on screen is built from.

Read from the model's own config (and, for parameter count and weight bytes, from its tensors), so
that the KV-cache formula, FLOP counts and the calculator use the same facts the model runs with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_bytes(name: str) -> int:
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}")
    return _DTYPE_BYTES[name]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    model_type: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    dtype: str
    param_count: int
    weight_bytes: int
    max_context: int
    rope_theta: float | None
    sliding_window: int | None
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        for field in ("layers", "heads", "kv_heads", "head_dim", "hidden_size", "vocab_size"):
            if getattr(self, field) <= 0:
                raise ValueError(f"ModelSpec.{field} must be positive")
        if self.heads % self.kv_heads:
            raise ValueError("query heads must be a multiple of KV heads")
        dtype_bytes(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def stored_bits(self) -> float | None:
        """Mean bits per weight when the weights are stored in fewer bytes than the float
        dtype's — a GGUF file's own blocks, run as stored (engine/gguf/mapped.py) — else None."""
        if not self.param_count or self.weight_bytes >= 0.9 * self.param_count * self.dtype_bytes:
            return None
        return 8 * self.weight_bytes / self.param_count

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) · layers · kv_heads · head_dim · bytes per value."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes(self, tokens: int) -> int:
        """KV cache bytes for `tokens` cached positions (no sliding window applied)."""
        return self.kv_bytes_per_token * tokens

    @property
    def query_groups(self) -> int:
        """How many query heads share one KV head (1 = multi-head, >1 = grouped-query)."""
        return self.heads // self.kv_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def _rope_theta(config: Any) -> float | None:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else None


def spec_from_model(model: torch.nn.Module, name: str) -> ModelSpec:
    """Build the spec from a loaded model; tied weights (embedding = LM head) count once."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    # parameters() yields each shared tensor once, so a tied embedding / LM head counts once.
    weights = list(model.parameters())
    params = sum(p.numel() for p in weights)
    weight_bytes = sum(p.numel() * p.element_size() for p in weights)
    return ModelSpec(
        name=name,
        model_type=config.model_type,
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        hidden_size=config.hidden_size,
        intermediate_size=getattr(config, "intermediate_size", 0) or 0,
        vocab_size=config.vocab_size,
        dtype=dtype_name(next(model.parameters()).dtype),
        param_count=params,
        weight_bytes=weight_bytes,
        max_context=getattr(config, "max_position_embeddings", 0) or 0,
        rope_theta=_rope_theta(config),
        sliding_window=getattr(config, "sliding_window", None),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )
