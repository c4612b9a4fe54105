"""A long context to feel it: the unmodified model's KV bytes, TTFT and ITL as the prompt grows,
measured; and a needle in a haystack — a fact placed at a chosen depth of a long text, then a
question about it — read by each shrinking method, teacher-forced on the answer: does the method
still put the answer's tokens first?

The haystack is public-domain text the app ships (assets/texts), repeated to the length asked;
the needle a sentence with a number the text never holds. The question and the answer follow the
model's chat template when it has one, as a user would ask.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from i18n import _

from ...clock import clock_ms
from ...errors import InputError
from ...forward import cache_layer_bytes, prepare_prompt
from ...loader import LoadedModel
from ...quant.texts import TEXTS_DIR, read_text
from .budget import METHODS, Shrink, described_budget
from .run import delayed_between, sample, teacher_forced, threads_used

NEEDLE = "The secret number of the archive is 4817."
QUESTION = "What is the secret number of the archive?"
LEAD = "The secret number of the archive is"  # the answer's start, given: its digits are scored
ANSWER = " 4817"
FILLER = ("gettysburg.txt", "declaration.txt")
DECODE_STEPS = 8  # decode steps timed after each prompt length


def filler_ids(lm: LoadedModel, tokens: int) -> list[int]:
    """`tokens` ids of the shipped texts, one after the other, repeated as often as needed."""
    text = "\n\n".join(read_text(TEXTS_DIR / name) for name in FILLER)
    ids = list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
    return (ids * (tokens // len(ids) + 1))[:tokens]


def haystack(lm: LoadedModel, tokens: int, depth: float) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids): about `tokens` of filler with the needle at `depth` (0: the start,
    1: the end) and the question after it, in the chat template, then the answer's first words
    (LEAD, as the model itself answers); the answer ids are the number's."""
    if not 0.0 <= depth <= 1.0:
        raise InputError("the needle's depth must be between 0 and 1")
    needle = list(lm.tokenizer(" " + NEEDLE + " ", add_special_tokens=False)["input_ids"])
    body = filler_ids(lm, max(1, tokens - len(needle)))
    at = round(depth * len(body))
    text = lm.tokenizer.decode(body[:at] + needle + body[at:])
    lead = list(lm.tokenizer(LEAD, add_special_tokens=False)["input_ids"])
    whole = list(lm.tokenizer(LEAD + ANSWER, add_special_tokens=False)["input_ids"])
    if whole[:len(lead)] != lead:  # a tokenizer that merges across the join: score it all
        lead = []
    prompt = prepare_prompt(lm.tokenizer, text + "\n\n" + QUESTION, True) + lead
    return prompt, whole[len(lead):]


@dataclass(frozen=True, slots=True)
class NeedleResult:
    """One method at one budget on the haystack (method None: the unmodified model)."""

    method: str | None
    budget: str
    found: bool  # every answer token the most probable, teacher-forced
    answer_logprob: float  # log p of the whole answer
    kv_bytes: int  # held when the answer begins


def needle_probe(lm: LoadedModel, shrinks: list[Shrink], tokens: int, depth: float,
                 stop: threading.Event | None = None,
                 say: Callable[[str, float], None] = lambda text, fraction: None
                 ) -> list[NeedleResult]:
    """The unmodified model first, then each method, on the same haystack; `say(text, fraction
    done)` before each reading."""
    prompt, answer = haystack(lm, tokens, depth)
    if lm.spec.max_context and len(prompt) + len(answer) > lm.spec.max_context:
        raise InputError(f"the haystack needs {len(prompt) + len(answer):,} tokens, more than the "
                         f"model's context of {lm.spec.max_context:,}")
    ids = prompt + answer
    found = []
    for i, shrink in enumerate([None, *shrinks]):
        if stop is not None and stop.is_set():
            break
        say(_("Reading the haystack with the unmodified model…") if shrink is None else
            _("Reading the haystack with {method} at a budget of {budget}…").format(
                method=_(METHODS[shrink.method]), budget=described_budget(shrink.budget.text())),
            i / (len(shrinks) + 1))
        run = teacher_forced(lm, ids, len(prompt), shrink, stop=stop)
        picks = [int(lp.argmax()) for lp in run.logps[:len(answer)]]
        logprob = sum(float(lp[t]) for lp, t in zip(run.logps, answer))
        found.append(NeedleResult(None if shrink is None else shrink.method,
                                  "full" if shrink is None else shrink.budget.text(),
                                  picks == answer, logprob, int(run.kv_bytes[0])))
    return found


@dataclass(frozen=True, slots=True)
class NeedleRun:
    """A haystack of about `tokens` with the needle at `depth`, and each method's result."""

    tokens: int
    depth: float
    results: tuple[NeedleResult, ...]


@dataclass(frozen=True, slots=True)
class LengthPoint:
    """The unmodified model at one prompt length: measured."""

    tokens: int
    kv_bytes: int  # after the prefill
    ttft_ms: float  # the prefill
    itl_ms: float  # median of DECODE_STEPS decode steps after it
    delayed: bool | None = None  # the delay rule over the prefill and its steps (None: unknown)


@torch.inference_mode()
def long_context(lm: LoadedModel, lengths: list[int], stop: threading.Event | None = None
                 ) -> list[LengthPoint]:
    """Prefill each length of filler, then DECODE_STEPS greedy steps; all timed."""
    points = []
    for n in lengths:
        if stop is not None and stop.is_set():
            break
        ids = torch.tensor([filler_ids(lm, n)], device=lm.device)
        cache = DynamicCache(config=lm.model.config)
        before = sample(lm)
        start = clock_ms(lm.device)
        out = lm.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        ttft = clock_ms(lm.device) - start
        held = sum(cache_layer_bytes(cache))
        steps = []
        for _step in range(DECODE_STEPS):
            token = out.logits[:, -1:].argmax(-1)
            start = clock_ms(lm.device)
            out = lm.model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
            steps.append(clock_ms(lm.device) - start)
        points.append(LengthPoint(n, held, ttft, float(statistics.median(steps)),
                                  delayed_between(before, sample(lm), threads_used())))
    return points



def per_token_growth(points: list[LengthPoint]) -> float:
    """Bytes of KV cache each prompt token adds (a least-squares slope over the points)."""
    x = np.array([p.tokens for p in points], dtype=float)
    y = np.array([p.kv_bytes for p in points], dtype=float)
    return float(np.polyfit(x, y, 1)[0]) if len(points) >= 2 else float("nan")
