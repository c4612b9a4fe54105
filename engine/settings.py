"""GenerationSettings: what a run was asked to do, checked once, recorded in the trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import InputError

MAX_NEW_TOKENS_LIMIT = 4096
FLOAT_WEIGHTS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # dtype → variant name
FLOAT_DTYPES = {v: k for k, v in FLOAT_WEIGHTS.items()}  # variant → the dtype it loads in
WEIGHT_ALIASES = {"int4": "q4_0"}  # what the CLI and the store also accept


def weights_name(name: str) -> str:
    """The weights variant a name stands for: dtype names and "int4" are aliases (float16 →
    fp16, int4 → q4_0); the one definition the store, the CLI and the native step share."""
    return FLOAT_WEIGHTS.get(name) or WEIGHT_ALIASES.get(name, name)
DECODERS = ("native", "torch")  # native: the hand-written C step where it can run, else torch


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """Options of one generation; temperature 0 (the default) means greedy decoding.

    top_k 0 and top_p 1.0 switch those filters off. `seed` None draws a fresh seed, which the run
    records so a sampled trace can be reproduced. `attention_layers` None records every layer
    whose attention over the whole run (the prefill's matrices and every decode step's rows,
    float16) fits `attention_budget_mb`; beyond it, evenly spaced layers.
    `decoder` "native" runs the decode steps on the hand-written C step (engine/kernels/native.py)
    wherever it can run — the run records which one ran and, if torch, why — and "torch" always
    runs them in transformers (eager PyTorch); the prefill is torch either way.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    chat_template: bool = True
    kv_cache: bool = True
    record_attention: bool = True
    attention_layers: tuple[int, ...] | None = None
    record_hidden: bool = True
    record_top_k: int = 10
    max_prompt_tokens: int = 2048
    attention_budget_mb: int = 64
    decoder: str = "native"

    def __post_init__(self) -> None:
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise InputError(f"max new tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, "
                             f"got {self.max_new_tokens}")
        if not 0.0 <= self.temperature <= 5.0:
            raise InputError(f"temperature must be between 0 and 5, got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top-k must be 0 (off) or positive, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InputError(f"seed must be a non-negative integer, got {self.seed}")
        if not 1 <= self.record_top_k <= 100:
            raise InputError(f"recorded top-k must be between 1 and 100, got {self.record_top_k}")
        if self.attention_budget_mb < 1:
            raise InputError("the attention budget must be at least 1 MB")
        if self.decoder not in DECODERS:
            raise InputError(f"the decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.max_prompt_tokens < 1:
            raise InputError("the prompt token limit must be positive")
        if self.attention_layers is not None:
            object.__setattr__(self, "attention_layers", tuple(sorted(set(self.attention_layers))))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def with_seed(self, seed: int) -> "GenerationSettings":
        return replace(self, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["attention_layers"] is not None:
            data["attention_layers"] = list(data["attention_layers"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GenerationSettings":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if known.get("attention_layers") is not None:
            known["attention_layers"] = tuple(known["attention_layers"])
        return cls(**known)
