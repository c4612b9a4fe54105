"""On-demand timing experiments: how prefill grows with the prompt, how decode grows with the
cache, and how batching serves more sequences per memory-bound step.

A sweep is a timed callable (size → one measurement in ms) run over its sizes by `interleaved`:
`repeats` rounds, each round visiting every size once (round-robin, not the repeats of one size
in a row), so a drift of a shared machine (another process, the clock, the memory's state)
touches every size alike instead of bending the curve. Every repeat is kept; a point reports
their median, and the chart their spread (min–max). The timers run plain forwards with a
DynamicCache and nothing recorded. `interleaved` yields each measurement as it is made, so the
page can show progress and stop at a time budget with what was measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch
from transformers import DynamicCache

from ..clock import clock_ms
from ..loader import LoadedModel

FILLER = " The quick brown fox jumps over the lazy dog."
REPEATS = 3

Timed = Callable[[int], float]  # size → one measurement (ms)
Rate = Callable[[int, float], float]  # (size, ms) → tokens per second


@dataclass(frozen=True, slots=True)
class SweepPoint:
    size: int  # prompt tokens, context tokens or batch size
    ms: float  # median over the repeats: TTFT (prefill) or ITL (decode) in milliseconds
    tokens_per_s: float  # at the median time
    repeats_ms: tuple[float, ...] = ()  # every repeat in the order measured (empty: not kept)

    @property
    def ms_min(self) -> float:
        return min(self.repeats_ms, default=self.ms)

    @property
    def ms_max(self) -> float:
        return max(self.repeats_ms, default=self.ms)


@dataclass(frozen=True, slots=True)
class Measurement:
    size: int
    repeat: int  # 0-based round
    ms: float


def interleaved(sizes: Sequence[int], timed: Timed, repeats: int = REPEATS,
                warmup: bool = True) -> Iterator[Measurement]:
    """`repeats` rounds over `sizes`, round-robin. `warmup` first runs the smallest size once,
    untimed: the first forward of a process pays one-time costs (allocations, kernel choice)."""
    if repeats < 1 or not sizes:
        raise ValueError("a sweep needs at least one size and one repeat")
    if warmup:
        timed(min(sizes))
    for r in range(repeats):
        for size in sizes:
            yield Measurement(size, r, timed(size))


def sweep_points(measurements: Iterable[Measurement], rate: Rate) -> tuple[SweepPoint, ...]:
    """One point per size (in the order first measured): the median of its repeats."""
    found: dict[int, list[float]] = {}
    for m in measurements:
        found.setdefault(m.size, []).append(m.ms)
    points = []
    for size, times in found.items():
        median = statistics.median(times)
        points.append(SweepPoint(size, median, rate(size, median), tuple(times)))
    return tuple(points)


def prefill_rate(tokens: int, ms: float) -> float:
    """Prompt tokens per second of prefill."""
    return tokens * 1000 / ms


def decode_rate(_context: int, ms: float) -> float:
    """One sequence: one token per decode step."""
    return 1000 / ms


def batch_rate(batch: int, ms: float) -> float:
    """B sequences: B tokens per decode step."""
    return batch * 1000 / ms


def filler_ids(lm: LoadedModel, n: int) -> list[int]:
    """Exactly n token ids of ordinary English text."""
    piece = lm.tokenizer(FILLER, add_special_tokens=False)["input_ids"]
    return (piece * (n // len(piece) + 1))[:n]


@torch.inference_mode()
def _prefill(lm: LoadedModel, ids: torch.Tensor) -> tuple[DynamicCache, torch.Tensor, float]:
    cache = DynamicCache(config=lm.model.config)
    start = clock_ms(lm.device)
    out = lm.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    token = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
    return cache, token, clock_ms(lm.device) - start


@torch.inference_mode()
def _decode_ms(lm: LoadedModel, cache: DynamicCache, token: torch.Tensor, steps: int) -> float:
    """The median of `steps` decode steps after the cache's contents."""
    times = []
    for _ in range(steps):
        start = clock_ms(lm.device)
        out = lm.model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        times.append(clock_ms(lm.device) - start)
    return statistics.median(times)


def prefill_timer(lm: LoadedModel) -> Timed:
    """Prompt tokens → prefill time (the engine part of TTFT)."""
    return lambda n: _prefill(lm, torch.tensor([filler_ids(lm, n)], device=lm.device))[2]


def decode_timer(lm: LoadedModel, steps: int = 4) -> Timed:
    """Tokens already in the KV cache → decode step time (ITL), the median of `steps` steps."""
    def timed(n: int) -> float:
        cache, token, _ = _prefill(lm, torch.tensor([filler_ids(lm, n)], device=lm.device))
        return _decode_ms(lm, cache, token, steps)
    return timed


def batch_timer(lm: LoadedModel, prompt_tokens: int = 64, steps: int = 6) -> Timed:
    """B copies of the same prompt decoded together → one decode step's time."""
    def timed(b: int) -> float:
        ids = torch.tensor([filler_ids(lm, prompt_tokens)] * b, device=lm.device)  # (B, T)
        cache, token, _ = _prefill(lm, ids)
        return _decode_ms(lm, cache, token, steps)
    return timed


def prompt_length_sweep(lm: LoadedModel, lengths: Sequence[int],
                        repeats: int = REPEATS) -> tuple[SweepPoint, ...]:
    return sweep_points(interleaved(lengths, prefill_timer(lm), repeats), prefill_rate)


def context_sweep(lm: LoadedModel, contexts: Sequence[int], steps: int = 4,
                  repeats: int = REPEATS) -> tuple[SweepPoint, ...]:
    return sweep_points(interleaved(contexts, decode_timer(lm, steps), repeats), decode_rate)


def batch_sweep(lm: LoadedModel, batches: Sequence[int], prompt_tokens: int = 64, steps: int = 6,
                repeats: int = REPEATS) -> tuple[SweepPoint, ...]:
    return sweep_points(interleaved(batches, batch_timer(lm, prompt_tokens, steps), repeats),
                        batch_rate)
