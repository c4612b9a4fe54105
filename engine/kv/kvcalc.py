"""KV-cache calculator over published model configs (assets/kv_models.json) and the loaded model.

Per layer and token the cache holds, with b bytes per value:
- MHA / GQA: 2 (K and V) · kv_heads · head_dim · b;
- MLA (DeepSeek): (latent + rope_dim) · b — one compressed vector shared by all heads.
A sliding-window layer holds at most `sliding_window` tokens. Quantized caches (int8, int4) add
one float16 scale per cached vector (per token and KV head; for MLA per latent and rope vector).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from i18n import _

from ..spec import ModelSpec

CACHE_DTYPES = {"fp32": 4.0, "fp16/bf16": 2.0, "int8": 1.0, "int4": 0.5}
SCALE_BYTES = 2  # one float16 scale per cached vector when quantized


@dataclass(frozen=True, slots=True)
class KVModel:
    name: str
    attention: str  # MHA, GQA or MLA
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    source: str = ""
    sliding_window: int | None = None
    sliding_layers: int = 0
    mla_latent: int | None = None
    mla_rope_dim: int | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.attention not in ("MHA", "GQA", "MLA"):
            raise ValueError(f"unknown attention type {self.attention!r}")
        if self.attention == "MLA" and not (self.mla_latent and self.mla_rope_dim):
            raise ValueError("MLA needs mla_latent and mla_rope_dim")
        if self.sliding_layers and not self.sliding_window:
            raise ValueError("sliding layers need a sliding window")

    def vectors_per_layer_token(self) -> list[int]:
        """Lengths of the vectors one layer caches per token."""
        if self.attention == "MLA":
            return [self.mla_latent, self.mla_rope_dim]
        return [self.head_dim] * (2 * self.kv_heads)

    def bytes_per_layer_token(self, dtype: str = "fp16/bf16") -> float:
        per_value = CACHE_DTYPES[dtype]
        vectors = self.vectors_per_layer_token()
        scales = SCALE_BYTES * len(vectors) if per_value < 2 else 0
        return sum(vectors) * per_value + scales

    def bytes_per_token(self, dtype: str = "fp16/bf16") -> float:
        """Every layer, one token (before any sliding window applies)."""
        return self.layers * self.bytes_per_layer_token(dtype)

    def total_bytes(self, context: int, batch: int = 1, dtype: str = "fp16/bf16") -> float:
        full_layers = self.layers - self.sliding_layers
        window = min(context, self.sliding_window or context)
        tokens = full_layers * context + self.sliding_layers * window
        return batch * tokens * self.bytes_per_layer_token(dtype)

    def rule(self, dtype: str = "fp16/bf16") -> str:
        b = CACHE_DTYPES[dtype]
        if self.attention == "MLA":
            core = _("({latent} latent + {rope} rope) · {b:g} B").format(
                latent=self.mla_latent, rope=self.mla_rope_dim, b=b)
        else:
            core = _("2 · {kv_heads} KV heads · {head_dim} head_dim · {b:g} B").format(
                kv_heads=self.kv_heads, head_dim=self.head_dim, b=b)
        if b < 2:
            core = _("{core} + {scales} scales · {scale_bytes} B").format(
                core=core, scales=len(self.vectors_per_layer_token()), scale_bytes=SCALE_BYTES)
        return _("{layers} layers × [{core}]").format(layers=self.layers, core=core)


def load_models(path: Path) -> list[KVModel]:
    data = json.loads(path.read_text())
    return [KVModel(**entry) for entry in data["models"]]


def from_spec(spec: ModelSpec) -> KVModel:
    kind = "MHA" if spec.kv_heads == spec.heads else "GQA"
    return KVModel(name=_("{model} (loaded)").format(model=spec.name), attention=kind, layers=spec.layers,
                   heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
                   sliding_window=spec.sliding_window,
                   sliding_layers=spec.layers if spec.sliding_window else 0)
