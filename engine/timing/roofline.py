"""Work per forward pass from the model spec: FLOPs, bytes moved, arithmetic intensity.

Named formulas (shown on the Prefill vs decode page), with E = vocab · hidden (one embedding
table) and the embedding handled explicitly, as gpt-fast's `_get_model_size` does:
- matmul FLOPs = 2 · (parameters − embedding tables) · new tokens  +  2 · E
  (the embedding tables are the input embedding and, untied, the LM head; the lookup does no
  arithmetic, the LM head runs for the last position only: the engine asks for one row of logits);
- attention FLOPs = 4 · layers · heads · head_dim · Σ context seen by each new token
  (q·kᵀ and weights·v, 2 FLOPs per multiply-add each);
- bytes moved = every weight once per forward, except that an untied input embedding is read one
  row per new token (a lookup), not whole (a row at the dtype's bytes per weight, or a GGUF
  file's mean: `ModelSpec.stored_bits`)  +  the KV cache read (all cached positions, the new
  ones included). Tied: the LM head reads the whole shared table, the lookups read rows of it
  again (counted once). Activations are ignored (they are small next to the weights here).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..kernels.microbench import Ceilings
from ..records.trace import Step, Trace
from ..spec import ModelSpec


@dataclass(frozen=True, slots=True)
class Work:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else 0.0


def embedding_tables(spec: ModelSpec) -> int:
    """How many vocab × hidden tables `param_count` holds: 1 tied (embedding = LM head), else 2."""
    return 1 if spec.tie_word_embeddings else 2


def forward_work(spec: ModelSpec, new_tokens: int, cached: int, kv_cache: bool = True,
                 streamed: int | None = None) -> Work:
    """A forward over `new_tokens` positions after `cached` positions already in the KV cache.
    `streamed`: the bytes of weights the step actually reads when they are not the spec's float
    tensors — the native step's packed low-bit weights (`DecoderUsed.weight_bytes`)."""
    table = spec.vocab_size * spec.hidden_size  # E: one embedding table's parameters
    body = spec.param_count - embedding_tables(spec) * table  # layers and norms
    matmul = 2 * body * new_tokens + 2 * table  # LM head: one position
    # token i (1-based) of the new ones attends over cached + i positions
    seen = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    attention = 4 * spec.layers * spec.heads * spec.head_dim * seen
    weights = spec.weight_bytes
    if not spec.tie_word_embeddings:  # the input table is only looked up: one row per token
        per_weight = spec.dtype_bytes if spec.stored_bits is None else spec.stored_bits / 8
        weights += (new_tokens - spec.vocab_size) * spec.hidden_size * per_weight
    if streamed is not None:
        weights = streamed
    kv_read = spec.kv_bytes_per_token * (cached + new_tokens) if kv_cache else 0
    return Work(flops=float(matmul + attention), bytes=float(weights + kv_read))


def native_weight_bytes(trace: Trace) -> int | None:
    """The bytes of weights a decode step of this trace streamed when the native step ran it
    (its packed codes and scales: a q4_0 run reads ~1/6 of the float32 bytes), else None."""
    d = trace.decoder
    return d.weight_bytes if d is not None and d.name == "native" else None


def verify_positions(trace: Trace, step: Step) -> int:
    """Positions a decode step's forward scored: 1, or in a speculative run 1 + the drafts its
    verify step proposed (for the first token of the verify step; the others had no forward)."""
    spec = trace.speculation
    if spec is None:
        return 1
    verify = sum(spec.first_of_step(step.index + 1)) - 2  # forwards before this one, less prefill
    return 1 + spec.step_proposed[verify] if 0 <= verify < len(spec.step_proposed) else 1


def step_work(trace: Trace, step: Step) -> Work:
    """The work the engine did for one recorded step (cache off: the whole sequence again)."""
    spec, t = trace.model, len(trace.prompt_token_ids)
    if step.phase == "prefill":
        return forward_work(spec, t, 0, trace.settings.kv_cache)
    if trace.settings.kv_cache:
        positions = verify_positions(trace, step)
        return forward_work(spec, positions, step.context_len - 1,
                            streamed=native_weight_bytes(trace))
    return forward_work(spec, step.context_len, 0, kv_cache=False)


FORWARD_ONLY = "model forward only (synchronized)"
WHOLE_STEP = "whole step: forward + sampling + recording (this trace has no forward-only times)"


def timed_by(trace: Trace) -> str:
    """Which time places the trace's steps on the roofline: the model forward alone when every
    step recorded it (`Step.forward_ms`), else the whole step (older trace files)."""
    steps = trace.steps
    if steps and all(s.forward_ms is not None for s in steps):
        return FORWARD_ONLY
    return WHOLE_STEP


def step_ms(step: Step, by: str) -> float:
    """The step's time as `timed_by` chose it."""
    if by == FORWARD_ONLY and step.forward_ms is not None:
        return step.forward_ms
    return step.latency_ms


def trace_points(trace: Trace) -> dict[str, tuple[Work, float]]:
    """The prefill and the median decode step (its work at the middle decode step), each with
    its time in ms as `timed_by(trace)` says."""
    by, steps = timed_by(trace), trace.steps
    if not steps:
        return {}
    points = {"prefill": (step_work(trace, steps[0]), step_ms(steps[0], by))}
    decode = trace.decode_forwards  # a speculative run: its verify forwards
    if decode:
        middle = decode[len(decode) // 2]
        points["decode (median step)"] = (step_work(trace, middle),
                                          statistics.median(step_ms(s, by) for s in decode))
    return points


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
