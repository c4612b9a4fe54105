"""Statistics of a serving run, with vLLM's definitions (engine/serving/record.py): what the Serving
page, the KV page and the CLI show, computed once here."""

from __future__ import annotations

from dataclasses import dataclass

from ..timing.metrics import percentile
from .record import RequestRecord, ServingRun


def peak_step(run: ServingRun) -> int:
    """The index of the step with the most blocks in use (the first such): where a finished
    run's block pool is worth looking at — after its last step every block is free again."""
    used = [s.blocks_used for s in run.steps]
    return used.index(max(used)) if used else 0


def tokens_per_step(run: ServingRun) -> list[int]:
    """Output tokens each step produced (a prefill produces its request's first token)."""
    made = {s.index: 0 for s in run.steps}
    for r in run.requests:
        for step in r.token_steps:
            if step in made:
                made[step] += 1
    return [made[s.index] for s in run.steps]


@dataclass(frozen=True, slots=True)
class StreamSummary:
    """What a stream's requests saw, with vLLM's definitions (engine/serving/record.py)."""

    throughput_tok_s: float
    ttft_p50: float | None
    ttft_p90: float | None
    itl_p50: float | None
    itl_p90: float | None
    peak_blocks: int
    prompt_tokens: int
    computed_prompt_tokens: int  # the prompt tokens prefill actually ran (not found in shared blocks)
    prefill_ms: float  # the time of the steps that only prefilled


def summarize_stream(run: ServingRun) -> StreamSummary:
    ttft = [r.ttft_ms for r in run.requests if r.ttft_ms is not None]
    itl = [g for r in run.requests for g in r.itl_ms]
    prompt = sum(len(r.spec.prompt_token_ids) for r in run.requests)
    return StreamSummary(
        run.throughput_tok_s, percentile(ttft, 50), percentile(ttft, 90), percentile(itl, 50),
        percentile(itl, 90), max((s.blocks_used for s in run.steps), default=0), prompt,
        prompt - sum(r.cached_tokens for r in run.requests),
        sum(s.ms for s in run.steps if s.kind == "prefill"))


def run_prefix(run: ServingRun, steps: int) -> ServingRun:
    """The run as it stood after its first `steps` steps (a replay's frame): later tokens cut,
    requests not finished by then marked running (admitted) or waiting."""
    if steps >= len(run.steps):
        return run
    kept = run.steps[:steps]
    now = max((s.start_ms + s.ms for s in kept), default=0.0)
    requests = []
    for r in run.requests:
        n = sum(1 for s in r.token_steps if s < steps)
        admitted = r.admitted_ms if r.admitted_ms is not None and r.admitted_ms < now else None
        finish = r.finish if n == len(r.token_ids) and r.finish in ("eos", "length") else (
            "refused" if r.finish == "refused" else "running" if admitted is not None else "waiting")
        requests.append(RequestRecord(r.id, r.spec, admitted, r.token_ids[:n], r.token_ms[:n],
                                      r.token_steps[:n], "", r.cached_tokens, r.preemptions, finish))
    return ServingRun(run.model, run.weights, run.config, tuple(requests), kept, run.threads,
                      run.created, run.stopped, run.cores)


def passed_over(run: ServingRun) -> list[RequestRecord]:
    """Requests that had arrived but were left out of at least one step (no batch slot, or too
    few free blocks) — a queue wait of a fraction of a ms before the first step is not one."""
    def waited(r: RequestRecord) -> bool:
        admitted = r.admitted_ms if r.admitted_ms is not None else float("inf")
        return any(r.spec.arrival_ms <= s.start_ms < admitted for s in run.steps)
    return [r for r in run.requests if r.finish != "refused" and waited(r)]
