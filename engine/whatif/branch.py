"""Branch a generation at any of its tokens: the same prompt and tokens up to the branch point,
then another token there, then the model's own choices again.

The lesson is the KV cache's: the keys and values of the prompt and of the tokens before the
branch point do not change when a later token does, so a branch starts from the original run's
cache cut back to that point (`DynamicCache.crop`) and computes only its own tokens — no prefill.
`branch()` times that and, for comparison, a full re-run of the same branch (a prefill of prompt
+ prefix + the new token, then the same decode steps), and checks both give the same tokens.

Shapes: P prompt tokens, K tokens kept before the branch point, N generated tokens in all.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers import DynamicCache

from ..clock import clock_ms
from ..errors import InputError
from ..forward import decode_one_token, eos_token_ids, prefill
from ..loader import LoadedModel
from ..sampling import choose_token


@dataclass(frozen=True, slots=True)
class Sampling:
    """How tokens after the branch point are chosen: greedy at temperature 0."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Generation:
    """A generation that keeps its KV cache, so it can be branched."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]  # generated ids
    cache: Any  # DynamicCache over prompt + tokens[:-1] (the last token was never fed)
    ms: float


@dataclass(frozen=True, slots=True)
class Branch:
    prompt_ids: tuple[int, ...]
    original: tuple[int, ...]  # the run branched from
    at: int  # K: original[:K] kept
    token: int  # what replaced original[K]
    tokens: tuple[int, ...]  # the branch: original[:K] + [token] + the continuation
    reused_tokens: int  # P + K positions whose cached keys and values were reused
    computed_tokens: int  # positions the branch ran through the model
    branch_ms: float  # from the cut cache: copy, crop and the branch's own steps
    rerun_ms: float  # the same branch recomputed: prefill of P + K + 1 tokens, then steps
    rerun_tokens: tuple[int, ...]  # the re-run's tokens (equal to `tokens`, checked)

    @property
    def first_difference(self) -> int:
        return next((i for i, (a, b) in enumerate(zip(self.original, self.tokens)) if a != b),
                    min(len(self.original), len(self.tokens)))

    def to_json(self) -> dict[str, Any]:
        return {"original": list(self.original), "branch": list(self.tokens),
                "reused_tokens": self.reused_tokens, "computed_tokens": self.computed_tokens,
                "at": self.at, "token": self.token, "branch_ms": round(self.branch_ms, 2),
                "rerun_ms": round(self.rerun_ms, 2), "same_as_rerun": self.tokens == self.rerun_tokens}


class _Chooser:
    """The next token from (V,) logits (engine/sampling.py), greedy at temperature 0, else
    sampled with its own seeded generator: a branch and its re-run draw the same numbers."""

    def __init__(self, sampling: Sampling, device: torch.device) -> None:
        self.sampling = sampling
        self.generator = torch.Generator(device=device).manual_seed(sampling.seed)

    def __call__(self, logits: torch.Tensor) -> int:
        s = self.sampling
        return choose_token(logits, s.temperature, s.top_k, s.top_p, self.generator)


def _continue(lm: LoadedModel, cache: Any, token: int, left: int, choose: _Chooser,
              eos: frozenset[int]) -> list[int]:
    """Feed `token` against `cache`, then choose and feed until `left` more tokens are chosen or
    an end-of-sequence token is; the tokens chosen."""
    device = lm.device
    out: list[int] = []
    while len(out) < left and token not in eos:
        logits, _ = decode_one_token(lm.model, torch.tensor([[token]], device=device), cache)
        token = choose(logits)
        out.append(token)
    return out


@torch.inference_mode()
def generate_cached(lm: LoadedModel, prompt_ids: Sequence[int], new_tokens: int,
                    sampling: Sampling = Sampling()) -> Generation:
    """Generate up to `new_tokens` tokens (stopping at end of sequence), keeping the cache."""
    if new_tokens < 1:
        raise InputError("a generation needs at least 1 new token")
    start = clock_ms(lm.device)
    cache = DynamicCache(config=lm.model.config)
    choose = _Chooser(sampling, lm.device)
    logits, _ = prefill(lm.model, torch.tensor([list(prompt_ids)], device=lm.device), cache)
    first = choose(logits)
    tokens = [first] + _continue(lm, cache, first, new_tokens - 1, choose, eos_token_ids(lm))
    return Generation(tuple(prompt_ids), tuple(tokens), cache, clock_ms(lm.device) - start)


def check_branch_point(original: Sequence[int], at: int, token: int, vocab: int) -> None:
    if not 0 <= at < len(original):
        raise InputError(f"--at {at} is not a generated token's index: the run has "
                         f"{len(original)} tokens (0 … {len(original) - 1})")
    if not 0 <= token < vocab:
        raise InputError(f"token id {token} is outside the vocabulary (0 … {vocab - 1})")


@torch.inference_mode()
def branch(lm: LoadedModel, run: Generation, at: int, token: int, new_tokens: int | None = None,
           sampling: Sampling = Sampling()) -> Branch:
    """`run` with its token `at` replaced by `token`, continued to `new_tokens` tokens in all
    (default: as many as the run has); the run's cache is copied, never changed."""
    n = len(run.tokens) if new_tokens is None else new_tokens
    check_branch_point(run.tokens, at, token, lm.spec.vocab_size)
    if n <= at:
        raise InputError(f"--max-new-tokens {n} leaves no room for a token at index {at}")
    eos = eos_token_ids(lm)
    keep = len(run.prompt_ids) + at  # positions P + K
    start = clock_ms(lm.device)
    cache = copy.deepcopy(run.cache)
    extra = cache.get_seq_length() - keep  # cached positions at and after the branch point
    if extra > 0:
        cache.crop(-extra)  # transformers: a negative count removes that many from the end
    after = _continue(lm, cache, token, n - at - 1, _Chooser(sampling, lm.device), eos)
    branch_ms = clock_ms(lm.device) - start
    tokens = (*run.tokens[:at], token, *after)
    computed = len(after)  # one forward per token chosen after the branch point
    start = clock_ms(lm.device)
    redo = DynamicCache(config=lm.model.config)
    ids = [*run.prompt_ids, *run.tokens[:at], token]
    logits, _ = prefill(lm.model, torch.tensor([ids], device=lm.device), redo)
    choose = _Chooser(sampling, lm.device)
    again: list[int] = []
    if n - at - 1 > 0 and token not in eos:
        again = [choose(logits)]
        again += _continue(lm, redo, again[0], n - at - 2, choose, eos)
    rerun_ms = clock_ms(lm.device) - start
    return Branch(run.prompt_ids, run.tokens, at, token, tokens, keep, computed, branch_ms,
                  rerun_ms, (*run.tokens[:at], token, *again))
