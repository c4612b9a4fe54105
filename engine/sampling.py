"""Choosing the next token: greedy, or temperature / top-k / top-p sampling with a seed."""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Scale by 1/temperature, then keep the top-k and the smallest top-p nucleus.

    logits (V,) → (V,) float32 with filtered entries set to -inf. The order matches
    transformers' logits processors (temperature, top-k, top-p).
    """
    scores = logits.float() / temperature
    if 0 < top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - torch.softmax(sorted_scores, dim=-1) >= top_p  # keep ≥1 token
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def choose_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                 generator: torch.Generator | None) -> int:
    """Temperature 0 means greedy (argmax); otherwise sample from the filtered distribution."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
