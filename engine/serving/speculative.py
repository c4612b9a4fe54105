"""Speculative decoding with prompt-lookup drafts, verified on the loaded model.

Decoding one token reads every weight once; a forward of k + 1 positions reads them once too, so
on a memory-bound machine it costs little more than one token. Speculation spends that slack:
a cheap drafter guesses the next k tokens, one forward of the last accepted token plus the k
guesses scores all of them, and every guess the model itself would have chosen (argmax) is kept.
Greedy output is unchanged by construction — each kept token is the model's own argmax given the
tokens before it — so the one thing speculation may change is speed.

The drafter is *prompt lookup* (transformers' `prompt_lookup_num_tokens`, Saxena's
prompt-lookup-decoding): find the most recent earlier occurrence of the context's last n tokens
(n from `ngram` down to 1) and propose the tokens that followed it. No second model; it pays
where the answer copies the prompt (rewrite this text with one change, fix this code) and costs a
little where it does not (a rejected draft still widened the forward).

One verify step: feed [last accepted token, d₁ … d_k] (1, k + 1) against the KV cache; the logits
at position j predict the token after it, so draft d_{j+1} is accepted while it equals the argmax
at position j; the first disagreement's argmax — or, when all k were accepted, the argmax after
d_k — is the model's own next token (the "bonus"), so every verify step yields at least one token.
The cache then holds K/V for the k + 1 fed positions; the rejected drafts' positions are cropped
(`DynamicCache.crop`), leaving exactly the positions a plain greedy run would have cached.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from ..clock import clock_ms
from ..errors import InputError
from ..forward import decode_one_token, eos_token_ids, prefill
from ..records.trace import Speculation

METHOD = "prompt-lookup"
METHODS = (METHOD,)
MAX_DRAFT_TOKENS = 16  # wider verify forwards stop being nearly free long before this
MAX_NGRAM = 8

# The page's and the benchmark's two samples: one whose answer copies long spans of the prompt
# (drafts are accepted, speculation pays), one whose answer the prompt cannot predict.
REWRITE_TEXT = (
    "The library opens at nine o'clock on Tuesday mornig. Visitors can borrow up to five books at "
    "a time, and each book may be kept for three weeks. Children under twelve must be accompanied "
    "by an adult. The reading room on the second floor is quiet, and phones must be switched off "
    "there. Every Thursday afternoon, volunteers read stories aloud to young children in the "
    "garden, weather permitting. On Tuesday evening the library hosts a talk about local history, "
    "which is free for everyone, and tea is served in the hall afterwards.")
REWRITE_PROMPT = ("Fix the one spelling mistake in this text and write out the whole corrected "
                  "text:\n\n" + REWRITE_TEXT)
FREE_PROMPT = "What are three benefits of regular exercise?"
SAMPLE_PROMPTS = {"rewrite (pays)": REWRITE_PROMPT, "free writing (does not pay)": FREE_PROMPT}


def lookup_draft(context: Sequence[int], ngram: int, draft_tokens: int) -> tuple[int, ...]:
    """Up to `draft_tokens` tokens that followed the most recent earlier occurrence of the
    context's last n tokens, trying n = `ngram` first, then shorter; () when nothing matches.

    "Earlier" excludes the suffix itself, so a match always has at least one following token.
    """
    ids = np.asarray(context, dtype=np.int64)
    for n in range(min(ngram, len(ids) - 1), 0, -1):
        # windows starting at 0 … len − n − 1: every earlier occurrence with a token after it
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)  # (len − n, n)
        hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tuple(int(t) for t in ids[start:start + draft_tokens])
    return ()


def accepted_drafts(drafts: Sequence[int], choice: Sequence[int]) -> int:
    """How many drafts to keep: the longest prefix where each draft equals the model's argmax at
    the position before it (`choice[j]` follows fed token j; fed token 0 is the last accepted
    one, so draft j is checked against choice[j]). Anything more would change the output."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == choice[accepted]:
        accepted += 1
    return accepted


@dataclass(frozen=True, slots=True)
class Burst:
    """What one forward after the prefill produced: the tokens it emitted (accepted drafts, then
    the bonus unless an accepted draft was end-of-sequence), their logits rows, how many drafts
    it proposed and accepted, the forward's own ms and the whole verify's ms (forward, acceptance,
    cache crop; synchronized clock)."""

    tokens: tuple[int, ...]
    logits: torch.Tensor  # (len(tokens), V): the row that chose each emitted token
    proposed: int
    accepted: int
    forward_ms: float
    verify_ms: float


def check_options(draft_tokens: int, ngram: int) -> None:
    """One sentence for a bad option (the CLI and the page show it as is)."""
    if not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise InputError(f"draft tokens must be between 1 and {MAX_DRAFT_TOKENS}, got {draft_tokens}")
    if not 1 <= ngram <= MAX_NGRAM:
        raise InputError(f"the n-gram length must be between 1 and {MAX_NGRAM}, got {ngram}")


def verify_bursts(model: Any, prompt_ids: Sequence[int], max_new_tokens: int, draft_tokens: int,
                  ngram: int, eos: frozenset[int], device: torch.device,
                  stop_event: threading.Event | None = None,
                  cache: DynamicCache | None = None) -> Iterator[Burst]:
    """The speculative loop: first the prefill's token (a Burst with nothing proposed), then one
    Burst per verify step, until end-of-sequence, `max_new_tokens` or `stop_event`.

    The time the caller spends between bursts is not in any Burst's ms (the trace builder does
    its bookkeeping there and times it itself). Drafts are capped at the tokens still allowed
    minus one, so a step never emits more than `max_new_tokens` in total. `cache` (a fresh
    DynamicCache by default) is the caller's when it wants to read the KV bytes between bursts.
    """
    check_options(draft_tokens, ngram)
    context = list(prompt_ids)
    cache = cache if cache is not None else DynamicCache(config=model.config)
    produced = 0
    with torch.inference_mode():
        while produced < max_new_tokens:
            if stop_event is not None and stop_event.is_set():
                return
            start = clock_ms(device)
            if produced == 0:
                logits, _ = prefill(model, torch.tensor([context], device=device), cache)
                logits = logits[None]  # (1, V)
                forward_ms = clock_ms(device) - start
                tokens, drafts, accepted = [int(logits[0].argmax())], (), 0
            else:
                drafts = lookup_draft(context, ngram, min(draft_tokens, max_new_tokens - produced - 1))
                fed = torch.tensor([[context[-1], *drafts]], device=device)  # (1, k + 1)
                out = model(input_ids=fed, cache=cache, use_cache=True, logits_to_keep=fed.shape[1])
                logits = out.logits[0]  # (k + 1, V): row j predicts the token after fed[j]
                forward_ms = clock_ms(device) - start
                choice = logits.argmax(dim=-1).tolist()  # the model's own greedy token per row
                accepted = accepted_drafts(drafts, choice)
                tokens = list(drafts[:accepted]) + [choice[accepted]]
                stop_at = next((j for j, t in enumerate(tokens) if t in eos), None)
                if stop_at is not None:  # an accepted EOS ends the answer; nothing after it counts
                    tokens = tokens[:stop_at + 1]
                # keep K/V of the last accepted token and the accepted drafts, drop the rejected
                rejected = len(drafts) - accepted
                if rejected:
                    cache.crop(-rejected)
                logits = logits[:len(tokens)]
            verify_ms = clock_ms(device) - start
            context.extend(tokens)
            produced += len(tokens)
            yield Burst(tuple(tokens), logits, len(drafts), min(accepted, len(tokens)),
                        forward_ms, verify_ms)
            if tokens[-1] in eos:
                return


@dataclass(frozen=True, slots=True)
class SpeculativeResult:
    """A speculative greedy generation: the output tokens, which of them came from an accepted
    draft (`drafted`, one flag per token; the prefill's token and each bonus are the model's own),
    the Speculation record (per verify step: proposed, accepted, emitted, ms), the whole run's
    wall ms (prefill included, synchronized) and why it ended."""

    token_ids: tuple[int, ...]
    drafted: tuple[bool, ...]
    speculation: Speculation
    ms: float
    prefill_ms: float
    stop_reason: str  # eos | length | stopped

    @property
    def tokens_per_s(self) -> float:
        """Output tokens / whole-run seconds (prefill included, as for plain greedy)."""
        return len(self.token_ids) / self.ms * 1000.0 if self.ms > 0 else 0.0


def _stop_reason(tokens: Sequence[int], max_new_tokens: int, eos: frozenset[int]) -> str:
    if tokens and tokens[-1] in eos:
        return "eos"
    return "length" if len(tokens) >= max_new_tokens else "stopped"


def speculative_generate(lm: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                         draft_tokens: int = 4, ngram: int = 3,
                         stop_event: threading.Event | None = None) -> SpeculativeResult:
    """Greedy generation with prompt-lookup drafts on `lm.model`; a stop keeps what was decoded."""
    if max_new_tokens < 1:
        raise InputError("max new tokens must be at least 1")
    eos, device = eos_token_ids(lm), lm.device
    tokens: list[int] = []
    proposed, accepted, emitted, step_ms = [], [], [], []
    prefill_ms = 0.0
    start = clock_ms(device)
    for i, burst in enumerate(verify_bursts(lm.model, prompt_ids, max_new_tokens, draft_tokens,
                                            ngram, eos, device, stop_event)):
        tokens.extend(burst.tokens)
        if i == 0:
            prefill_ms = burst.verify_ms
            continue
        proposed.append(burst.proposed)
        accepted.append(burst.accepted)
        emitted.append(len(burst.tokens))
        step_ms.append(burst.verify_ms)
    ms = clock_ms(device) - start
    speculation = Speculation(METHOD, draft_tokens, ngram, tuple(proposed), tuple(accepted),
                              tuple(emitted), tuple(step_ms))
    return SpeculativeResult(tuple(tokens), speculation.drafted(len(tokens)), speculation, ms,
                             prefill_ms, _stop_reason(tokens, max_new_tokens, eos))


@dataclass(frozen=True, slots=True)
class PlainResult:
    """Plain greedy on the same model and cache API: one forward per token."""

    token_ids: tuple[int, ...]
    ms: float


def plain_greedy(lm: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                 stop_event: threading.Event | None = None) -> PlainResult:
    """The reference the speedup is measured against: prefill, then `decode_one_token` (the
    runner's torch step, a DynamicCache) until EOS or `max_new_tokens` — the same model, cache
    and clock as the speculative loop, so the ratio is speculation's alone."""
    eos, device, model = eos_token_ids(lm), lm.device, lm.model
    cache = DynamicCache(config=model.config)
    tokens: list[int] = []
    start = clock_ms(device)
    with torch.inference_mode():
        logits, _ = prefill(model, torch.tensor([list(prompt_ids)], device=device), cache)
        tokens.append(int(logits.argmax()))
        while len(tokens) < max_new_tokens and tokens[-1] not in eos:
            if stop_event is not None and stop_event.is_set():
                break
            logits, _ = decode_one_token(model, torch.tensor([[tokens[-1]]], device=device), cache)
            tokens.append(int(logits.argmax()))
    return PlainResult(tuple(tokens), clock_ms(device) - start)


@dataclass(frozen=True, slots=True)
class SpeculationComparison:
    """Plain greedy and speculative decoding of one prompt, measured in paired rounds (the order
    alternates each round, so neither always runs on a warmer or quieter machine).

    Rates are output tokens / whole-run seconds (prefill included, the same for both); `speedup`
    is the median over rounds of speculative ÷ plain tokens/s within the round. `equal` says the
    outputs agree token for token in every round; `first_difference` is the first output index
    where they do not (None when equal). Empty tuples and None rates mean no round finished
    (stopped before)."""

    rounds: int
    plain_ms: tuple[float, ...]
    speculative_ms: tuple[float, ...]
    plain_tokens_per_s: float | None
    speculative_tokens_per_s: float | None
    speedup: float | None
    equal: bool
    first_difference: int | None
    plain_token_ids: tuple[int, ...]
    result: SpeculativeResult | None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token sequences differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_speculation(lm: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                        draft_tokens: int = 4, ngram: int = 3, rounds: int = 3,
                        stop_event: threading.Event | None = None,
                        progress: Callable[[int, int], None] | None = None) -> SpeculationComparison:
    """Plain greedy vs speculative on one prompt, `rounds` paired rounds after a short warm-up
    of both (the first wide forward sets up kernels a later one reuses). `progress(done, total)`
    is called after every measured run. A stop keeps the rounds already finished."""
    check_options(draft_tokens, ngram)
    if not 1 <= rounds <= 20:
        raise InputError(f"rounds must be between 1 and 20, got {rounds}")
    warm = min(max_new_tokens, 8)
    if stop_event is None or not stop_event.is_set():
        plain_greedy(lm, prompt_ids, warm)
        speculative_generate(lm, prompt_ids, warm, draft_tokens, ngram)
    plain_ms: list[float] = []
    spec_ms: list[float] = []
    ratios: list[float] = []
    plain: PlainResult | None = None
    spec: SpeculativeResult | None = None
    equal, diff = True, None
    for r in range(rounds):
        order = ("plain", "spec") if r % 2 == 0 else ("spec", "plain")
        done: dict[str, Any] = {}
        for name in order:
            if stop_event is not None and stop_event.is_set():
                break
            if name == "plain":
                done[name] = plain_greedy(lm, prompt_ids, max_new_tokens)
            else:
                done[name] = speculative_generate(lm, prompt_ids, max_new_tokens, draft_tokens, ngram)
            if progress is not None:
                progress(2 * r + len(done), 2 * rounds)
        if len(done) < 2:
            break
        plain, spec = done["plain"], done["spec"]
        plain_ms.append(plain.ms)
        spec_ms.append(spec.ms)
        ratios.append(spec.tokens_per_s / (len(plain.token_ids) / plain.ms * 1000.0))
        if diff is None:
            diff = first_difference(plain.token_ids, spec.token_ids)
        equal = equal and diff is None
    if not ratios:
        return SpeculationComparison(0, (), (), None, None, None, True, None, (), None)
    n_plain, n_spec = len(plain.token_ids), len(spec.token_ids)
    return SpeculationComparison(
        rounds=len(ratios), plain_ms=tuple(plain_ms), speculative_ms=tuple(spec_ms),
        plain_tokens_per_s=n_plain / float(np.median(plain_ms)) * 1000.0,
        speculative_tokens_per_s=n_spec / float(np.median(spec_ms)) * 1000.0,
        speedup=float(np.median(ratios)), equal=equal, first_difference=diff,
        plain_token_ids=plain.token_ids, result=spec)
