"""Choosing the next token: greedy, or temperature / top-k / top-p sampling with a seed; and what a
step records of the model's distribution around the chosen token."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True, eq=False)
class Choice:
    """The token a step chose and the model's own distribution around it."""

    token: int
    prob: float  # the chosen token's probability
    rank: int  # how many tokens were more probable
    top_ids: np.ndarray  # (k,) int64, most probable first
    top_probs: np.ndarray  # (k,) float32


def top_choices(probs: torch.Tensor, token: int, k: int) -> Choice:
    """The chosen token's probability and rank in `probs` (V,), and the k most probable."""
    return _choices(probs[None], torch.tensor([token], device=probs.device), k)[0]


def greedy_choices(logits: torch.Tensor, k: int) -> list[Choice]:
    """`choose_token` at temperature 0 and `top_choices` for every row of logits (B, V) at once,
    as one batch of operations (a server's batch: its runs' threads then do none of it): the
    same tokens, probabilities and ranks as row by row."""
    probs = torch.softmax(logits.float(), dim=-1)  # (B, V)
    return _choices(probs, torch.argmax(logits, dim=-1), k)  # argmax: the first of equal maxima


def _choices(probs: torch.Tensor, tokens: torch.Tensor, k: int) -> list[Choice]:
    """probs (B, V), tokens (B,) chosen → each row's Choice."""
    chosen = probs.gather(1, tokens[:, None])  # (B, 1)
    ranks = (probs > chosen).sum(dim=-1)  # (B,)
    top = torch.topk(probs, k, dim=-1)
    ids = top.indices.cpu().numpy().astype(np.int64)  # (B, k)
    values = top.values.cpu().numpy().astype(np.float32)
    return [Choice(int(t), float(p), int(r), ids[b], values[b]) for b, (t, p, r) in enumerate(
        zip(tokens.tolist(), chosen[:, 0].tolist(), ranks.tolist()))]


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
