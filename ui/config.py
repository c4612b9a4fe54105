"""The app's configuration and limits, read from the environment (hosted demo or local)."""

from __future__ import annotations

import os
from dataclasses import dataclass

# The sidebar's weights variants (engine/quant/variants.py). Hosted: float32 and q4_0 only —
# the default model's float32 entry with its native decoder and the q4_0 copy with its decoder,
# each with its batch's K/V pool (ui/batching.py), both stay loaded within HOSTED_MODEL_MB
# (measured: 1.33 + 0.90 GB; a third choice would make visitors evict each other's model).
LOCAL_WEIGHTS = ("fp32", "fp16", "bf16", "int8", "q8_0", "q6_k", "q4_k_m", "q4_k", "q4_0", "q4_1")
HOSTED_WEIGHTS = ("fp32", "q4_0")
HOSTED_MODEL_MB = 2560
MAX_PROMPT_CHARS = 20_000  # the prompt box and a share link: far above what the token limit lets through


@dataclass(frozen=True, slots=True)
class Limits:
    """What one click may ask of the shared model; enforced on the server, not only by widgets."""

    prompt_tokens: int
    new_tokens: int
    upload_mb: int  # a trace file, as uploaded
    trace_mb: int  # a trace file, decompressed: what it will hold in memory
    trace_tokens: int  # prompt + output of a trace file the pages will show
    click_s: float | None = None  # model time one click may take (None: no limit)
    kernel_rounds: int = 3  # paired rounds of the decode-kernel comparison
    file_growth: float = 64.0  # how many times its size an opened file may grow when decoded
    record_mb: int = 64  # attention one run records (float16): GenerationSettings.attention_budget_mb

    @property
    def sequence_tokens(self) -> int:
        """The longest token sequence an experiment runs the model on (prompt + answer)."""
        return self.prompt_tokens + self.new_tokens


@dataclass(frozen=True, slots=True)
class AppConfig:
    hosted: bool
    limits: Limits
    model_cache_mb: int  # weights the model store keeps (local: a few dtype/model choices)
    session_mb: int  # session records kept for reloads, all sessions together
    session_ttl_s: float
    client_sessions: int = 64  # records one visitor (ui/clients.py) may keep: its oldest go first
    client_mb: int = 1024  # bytes one visitor's records may hold
    address_sessions: int | None = None  # records the visitors of one address may keep together
    address_mb: int | None = None  # bytes they may hold together (None: the store's bound)
    session_entries: int = 256  # records of all visitors together
    session_keep_s: float = 1800.0  # a record changed this recently is never evicted for others
    uploads_mb: int = 1024  # uploaded files the server holds for all sessions together
    published_runs: int = 256  # published links kept, all visitors together (each for the ttl)
    published_mb: int = 1024  # their bytes
    client_published: int = 64  # links one visitor may have published at once
    address_published: int | None = None  # the visitors of one address together
    batching: bool = False  # visitors' Generate runs decode in one batch (engine/serving/batcher.py)

    @classmethod
    def from_env(cls) -> "AppConfig":
        if os.environ.get("INFERENCE_EXPLORER_HOSTED") == "1":
            return cls(True, Limits(256, 64, 50, 96, 320, click_s=_click_s(), kernel_rounds=2,
                                       file_growth=8.0),
                       HOSTED_MODEL_MB, 512, 2 * 3600.0, client_sessions=8, client_mb=128,
                       address_sessions=160, address_mb=384, uploads_mb=_uploads_mb(200),
                       published_runs=256, published_mb=128, client_published=8,
                       address_published=120, batching=_batching(True))
        return cls(False, Limits(1024, 256, 50, 512, 8192, record_mb=256), 4096, 2048,
                   12 * 3600.0, uploads_mb=_uploads_mb(1024), batching=_batching(False))

    @property
    def weights_choices(self) -> tuple[str, ...]:
        """The sidebar's weights variants: hosted, the two that fit its cap together."""
        return HOSTED_WEIGHTS if self.hosted else LOCAL_WEIGHTS


def _click_s(default: float = 15.0) -> float:
    """Hosted model time per click: 15 s, or INFERENCE_EXPLORER_CLICK_S (1–600) for a Space on
    other hardware — and for tests that must not turn a busy machine into a failure."""
    try:
        value = float(os.environ.get("INFERENCE_EXPLORER_CLICK_S", default))
    except ValueError:
        return default
    return min(max(value, 1.0), 600.0) if value == value else default


def _uploads_mb(default: int) -> int:
    """Uploaded files held for all sessions together: `default` MB, or
    INFERENCE_EXPLORER_UPLOADS_MB (1–65536) for a server with more or less memory — and for a
    test that fills it with one small file."""
    try:
        value = int(os.environ.get("INFERENCE_EXPLORER_UPLOADS_MB", default))
    except ValueError:
        return default
    return min(max(value, 1), 65536)


def _batching(default: bool) -> bool:
    """INFERENCE_EXPLORER_BATCHING=1 / 0 turns batched Generate runs on or off (hosted: on)."""
    value = os.environ.get("INFERENCE_EXPLORER_BATCHING", "")
    return default if value not in ("0", "1") else value == "1"


def config() -> AppConfig:
    """Read from the environment on each call (cheap), so tests can switch hosted mode."""
    return AppConfig.from_env()
