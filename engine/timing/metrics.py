"""Latency metrics as serving benchmarks (vLLM benchmark_serving, GenAI-Perf) define them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..records.trace import Trace


def percentile(values: tuple[float, ...] | list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default, as vLLM reports); None if empty."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


@dataclass(frozen=True, slots=True)
class LatencySummary:
    ttft_ms: float | None
    itl_mean_ms: float | None
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    itl_p99_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    output_tokens: int
    prompt_tokens: int

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def summarize(trace: Trace) -> LatencySummary:
    """TTFT, ITL percentiles, TPOT = (e2e − TTFT)/(output tokens − 1), throughputs."""
    itl = trace.itl_ms
    n = len(trace.steps)
    e2e = trace.token_times_ms[-1] if n else None
    ttft = trace.ttft_ms
    tpot = (e2e - ttft) / (n - 1) if n > 1 and e2e is not None and ttft is not None else None
    decode_ms = sum(itl)
    prefill = trace.prefill
    return LatencySummary(
        ttft_ms=ttft,
        itl_mean_ms=float(np.mean(itl)) if itl else None,
        itl_p50_ms=percentile(itl, 50),
        itl_p90_ms=percentile(itl, 90),
        itl_p99_ms=percentile(itl, 99),
        tpot_ms=tpot,
        e2e_ms=e2e,
        decode_tokens_per_s=len(itl) / decode_ms * 1000 if decode_ms > 0 else None,
        prefill_tokens_per_s=(len(trace.prompt_token_ids) / prefill.latency_ms * 1000
                              if prefill and prefill.latency_ms > 0 else None),
        output_tokens=n,
        prompt_tokens=len(trace.prompt_token_ids),
    )


def replay_pace(trace: Trace, max_total_s: float = 20.0, max_step_s: float = 2.0) -> list[float]:
    """Seconds to wait before showing each step in a replay: the recorded pace (the first step
    includes tokenization), slowed never, sped up so that no wait exceeds `max_step_s` and the whole
    replay ends within `max_total_s` — a replay is a view, and must not hold a server thread for
    long, whatever a file says its steps took."""
    waits = [(s.latency_ms + (trace.tokenize_ms if i == 0 else 0.0)) / 1000
             for i, s in enumerate(trace.steps)]
    waits = [min(max(w, 0.0), max_step_s) for w in waits]
    total = sum(waits)
    scale = max_total_s / total if total > max_total_s else 1.0
    return [w * scale for w in waits]


def forward_median_ms(trace: Trace) -> float | None:
    """Median time of the decode forwards (`Trace.decode_forwards`): for a plain run its ITL
    median; for a speculative run the median verify forward, whose tokens arrived together."""
    times = [s.latency_ms for s in trace.decode_forwards]
    return percentile(times, 50) if times else None
