"""On-demand timing experiments: how prefill grows with the prompt, how decode grows with the
cache, and how batching serves more sequences per memory-bound step.

Each sweep is a generator of points, so the UI can show a progress bar; each point is the best
(minimum) of `repeats` runs, plain forwards with a DynamicCache and nothing recorded.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterator

import torch
from transformers import DynamicCache

from .loader import LoadedModel
from .runner import clock_ms

FILLER = " The quick brown fox jumps over the lazy dog."


@dataclass(frozen=True, slots=True)
class SweepPoint:
    size: int  # prompt tokens, context tokens or batch size
    ms: float  # TTFT (prefill) or ITL (decode) in milliseconds
    tokens_per_s: float


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
    times = []
    for _ in range(steps):
        start = clock_ms(lm.device)
        out = lm.model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(clock_ms(lm.device) - start)
    return statistics.median(times)


def prompt_length_sweep(lm: LoadedModel, lengths: list[int], repeats: int = 2) -> Iterator[SweepPoint]:
    """Prefill time (the engine part of TTFT) against prompt tokens."""
    for n in lengths:
        ids = torch.tensor([filler_ids(lm, n)], device=lm.device)
        ms = min(_prefill(lm, ids)[2] for _ in range(repeats))
        yield SweepPoint(n, ms, n / ms * 1000)


def context_sweep(lm: LoadedModel, contexts: list[int], steps: int = 4,
                  repeats: int = 2) -> Iterator[SweepPoint]:
    """Decode step time (ITL) against the number of tokens already in the KV cache."""
    for n in contexts:
        best = float("inf")
        for _ in range(repeats):
            cache, token, _ = _prefill(lm, torch.tensor([filler_ids(lm, n)], device=lm.device))
            best = min(best, _decode_ms(lm, cache, token, steps))
        yield SweepPoint(n, best, 1000 / best)


def batch_sweep(lm: LoadedModel, batches: list[int], prompt_tokens: int = 64, steps: int = 6,
                repeats: int = 2) -> Iterator[SweepPoint]:
    """Decode ITL and total tokens/s for B copies of the same prompt decoded together."""
    for b in batches:
        ids = torch.tensor([filler_ids(lm, prompt_tokens)] * b, device=lm.device)  # (B, T)
        best = float("inf")
        for _ in range(repeats):
            cache, token, _ = _prefill(lm, ids)
            best = min(best, _decode_ms(lm, cache, token, steps))
        yield SweepPoint(b, best, b * 1000 / best)
