"""Work per forward pass from the model spec: FLOPs, bytes moved, arithmetic intensity.

Named formulas (shown on the Timing page):
- matmul FLOPs = 2 · (parameters − vocab · hidden) · new tokens  +  2 · vocab · hidden
  (the LM head runs for the last position only: the engine asks for one row of logits);
- attention FLOPs = 4 · layers · heads · head_dim · Σ context seen by each new token
  (q·kᵀ and weights·v, 2 FLOPs per multiply-add each);
- bytes moved = every weight once per forward  +  the KV cache read (all cached positions,
  the new ones included). Activations are ignored (they are small next to the weights here).
"""

from __future__ import annotations

from dataclasses import dataclass

from .microbench import Ceilings
from .spec import ModelSpec
from .trace import Step, Trace


@dataclass(frozen=True, slots=True)
class Work:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else 0.0


def forward_work(spec: ModelSpec, new_tokens: int, cached: int, kv_cache: bool = True) -> Work:
    """A forward over `new_tokens` positions after `cached` positions already in the KV cache."""
    embed = spec.vocab_size * spec.hidden_size
    matmul = 2 * (spec.param_count - embed) * new_tokens + 2 * embed
    # token i (1-based) of the new ones attends over cached + i positions
    seen = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    attention = 4 * spec.layers * spec.heads * spec.head_dim * seen
    kv_read = spec.kv_bytes_per_token * (cached + new_tokens) if kv_cache else 0
    return Work(flops=float(matmul + attention), bytes=float(spec.weight_bytes + kv_read))


def step_work(trace: Trace, step: Step) -> Work:
    """The work the engine did for one recorded step (cache off: the whole sequence again)."""
    spec, t = trace.model, len(trace.prompt_token_ids)
    if step.phase == "prefill":
        return forward_work(spec, t, 0, trace.settings.kv_cache)
    if trace.settings.kv_cache:
        return forward_work(spec, 1, step.context_len - 1)
    return forward_work(spec, step.context_len, 0, kv_cache=False)


@dataclass(frozen=True, slots=True)
class Utilization:
    """What a step achieved, and against measured ceilings (None when none were measured)."""

    flop_s: float  # FLOPs / time
    bytes_s: float  # bytes moved / time
    mfu: float | None  # flop_s / peak matmul FLOP/s
    mbu: float | None  # bytes_s / measured read bandwidth
    bound: str | None  # "compute" right of the ridge point, else "memory bandwidth"


def utilization(work: Work, ms: float, ceil: Ceilings | None = None) -> Utilization:
    if not ms > 0:
        raise ValueError(f"a step time must be positive, got {ms} ms")
    flop_s, bytes_s = work.flops / (ms / 1000), work.bytes / (ms / 1000)
    if ceil is None:
        return Utilization(flop_s, bytes_s, None, None, None)
    return Utilization(flop_s, bytes_s, flop_s / (ceil.matmul_tflop_s * 1e12),
                       bytes_s / (ceil.bandwidth_gb_s * 1e9),
                       "compute" if work.intensity > ceil.ridge else "memory bandwidth")
