"""Latency metrics as serving benchmarks (vLLM benchmark_serving, GenAI-Perf) define them, and
one named exception the app's pages apply: the warm-up rule (`WARMUP_RULE`).

Why the rule: in the app, the first decode step runs while the page draws the first token (the
browser and the server share the model's cores on a laptop), so it can take several times the
later steps (e.g. 291 ms against a 65 ms median) — a cost of showing the run, not of the model.
The benchmarks' own warm-up happens before their clock starts, which a live run cannot do; so the
step is marked, and the pages' ITL figures leave it out and say so. `summarize` without
`skip_warmup` keeps every gap, exactly as the benchmarks define ITL.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import numpy as np

from i18n import N_, _

from ..records.trace import Trace

WARMUP_FACTOR = 2.0  # the first decode step against the median of the decode steps after it
WARMUP_AFTER = 2  # decode steps after the first needed for a median to compare with

# A message of the catalogs (`_(WARMUP_RULE)` shows it in the session's language), so its numbers
# are WARMUP_FACTOR's and WARMUP_AFTER's values written in: change them together.
WARMUP_RULE = N_("The first decode step is marked *warm-up* when it took more than 2× the median of "
                 "the decode steps after it (at least 2 of them): it pays one-time work — in this "
                 "app, mostly the page drawing the first token on the same cores — not the model's "
                 "steady cost. The ITL percentiles, the mean ITL and the decode rate shown here "
                 "leave a warm-up step out; TTFT, TPOT and the end-to-end time keep it (vLLM and "
                 "GenAI-Perf count every gap in ITL: they warm up before their clock starts). A "
                 "step shared with other runs (the server's batch) is never marked: its time is "
                 "the batch's, other visitors' prompts joining it included.")


def warmup_step(trace: Trace) -> int | None:
    """The index of the first decode step when the warm-up rule marks it (`WARMUP_RULE`), else
    None. A speculative run's steps are not one forward each, and a batched step's time is its
    batch's (a slow one took other runs' prompts): never marked."""
    decode = trace.decode_steps
    if trace.speculation is not None or len(decode) < 1 + WARMUP_AFTER or decode[0].batch > 1:
        return None
    later = statistics.median(s.latency_ms for s in decode[1:])
    return decode[0].index if decode[0].latency_ms > WARMUP_FACTOR * later else None


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
    warmup_step: int | None = None  # the step the ITL figures leave out (skip_warmup), if any
    warmup_ms: float | None = None  # its time

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def summarize(trace: Trace, skip_warmup: bool = False) -> LatencySummary:
    """TTFT, ITL percentiles, TPOT = (e2e − TTFT)/(output tokens − 1), throughputs. With
    `skip_warmup`, a first decode step the warm-up rule marks (`warmup_step`) is left out of the
    ITL percentiles, the mean ITL and the decode rate (and named in the summary)."""
    itl = trace.itl_ms
    warm = warmup_step(trace) if skip_warmup else None
    if warm is not None:
        itl = itl[1:]  # the first decode step is the first ITL
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
        warmup_step=warm,
        warmup_ms=trace.steps[warm].latency_ms if warm is not None else None,
    )


def warmup_note(summary: LatencySummary) -> str:
    """One sentence for where ITL is shown: which step the figures leave out, and the rule."""
    if summary.warmup_step is None:
        return _("Warm-up rule (no step marked in this run): {rule}").format(rule=_(WARMUP_RULE))
    return _("Step {step} ({ms:,.0f} ms) is left out as warm-up. {rule}").format(
        step=summary.warmup_step, ms=summary.warmup_ms, rule=_(WARMUP_RULE))


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
