"""Run a shrinking method on the loaded model, teacher-forced, against the unmodified model.

The unmodified model reads a token sequence (a prompt and the tokens that follow it: the user's
own run, or a held-out text) through its stock attention and full cache; the method reads the
same tokens through its cache and attention. At every position after the prompt both give a
next-token distribution, compared as the KV page's cache variants are (engine/kv/cachelab.py):
KL(unmodified ‖ method) and whether the most probable token agrees; and each gives the
perplexity of the tokens that actually follow. Bytes held are the cache tensors' `nbytes` after
each step; bytes read are those a decode step's attention reads (engine/kv/shrink/attend.py);
each decode step is timed.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from i18n import _

from ...attention import overriding
from ...clock import (
    MachineSample,
    clock_ms,
    others_share,
    usable_cores,
)
from ...forward import cache_layer_bytes
from ...loader import LoadedModel
from ...quant.texts import TEXTS_DIR, read_text
from ...timing.disturbance import over_limits
from ..cachelab import check_sequence
from .attend import ShrinkAttention
from .budget import METHODS, SPARSE_METHODS, TOKEN_METHODS, Shrink, described_budget
from .evict import EvictLayer
from .latent import full_rank, latent_cache
from .sparse import IndexedLayer, indexer_projections

HELD_OUT = TEXTS_DIR / "gettysburg.txt"  # never the latent's or the indexer's calibration text
HELD_OUT_PROMPT, HELD_OUT_POSITIONS = 32, 96
SOURCES = ("run", "held-out")


@dataclass(frozen=True, slots=True, eq=False)
class Forced:
    """One teacher-forced pass: per position after the prompt (the prefill's last one first)."""

    logps: tuple[torch.Tensor, ...]  # (V,) log-probabilities
    kv_bytes: np.ndarray  # (positions,) cache bytes held after that forward
    read_bytes: np.ndarray  # (positions − 1,) cache bytes each decode step's attention read
    step_ms: np.ndarray  # (positions − 1,) each decode step's wall time
    rows: np.ndarray | None  # (positions − 1, H, S) one layer's attention per decode step
    delayed: bool | None = None  # the delay rule over its decode steps (None: not measured)


@dataclass(frozen=True, slots=True, eq=False)
class ShrinkRun:
    """A method at a budget against the unmodified model on one token sequence."""

    method: str
    budget: str  # as given: 'full', '64', '25%'
    count: int  # the budget resolved: a rank, keys per head, or tokens
    prompt_tokens: int
    kl: np.ndarray  # (positions,) KL(unmodified ‖ method), nats
    agree: np.ndarray  # (positions,) same most probable token
    nll: np.ndarray  # (positions − 1,) the method's −log p of the token that follows
    dense_nll: np.ndarray  # the unmodified model's
    kv_bytes: np.ndarray  # (positions,) held after each forward
    dense_kv_bytes: np.ndarray
    read_bytes: np.ndarray  # (positions − 1,) read by each decode step's attention
    dense_read_bytes: np.ndarray
    step_ms: np.ndarray  # (positions − 1,)
    dense_step_ms: np.ndarray
    layer: int  # the layer `rows` shows
    rows: np.ndarray | None  # (positions − 1, H, S) float32, that layer's attention per step
    source: str = "run"  # what was read: "run" (the user's) or "held-out" (HELD_OUT's text)
    delayed: bool | None = None  # other work delayed its decode steps or the unmodified one's

    @property
    def top1_agreement(self) -> float:
        return float(self.agree.mean()) if len(self.agree) else 1.0

    @property
    def mean_kl(self) -> float:
        return float(self.kl.mean()) if len(self.kl) else 0.0

    @property
    def ppl(self) -> float:
        return math.exp(float(self.nll.mean())) if len(self.nll) else float("nan")

    @property
    def dense_ppl(self) -> float:
        return math.exp(float(self.dense_nll.mean())) if len(self.dense_nll) else float("nan")

    @property
    def decode_ms(self) -> float:
        return float(statistics.median(self.step_ms)) if len(self.step_ms) else float("nan")

    @property
    def dense_decode_ms(self) -> float:
        return float(statistics.median(self.dense_step_ms)) if len(self.dense_step_ms) else float("nan")

    def summary(self) -> dict:
        """What `python -m engine kv-shrink --json` prints."""
        return {"method": self.method, "budget": self.budget, "resolved": self.count,
                "source": self.source, "delayed": self.delayed,
                "prompt_tokens": self.prompt_tokens, "positions": int(len(self.kl)),
                "kv_bytes": int(self.kv_bytes[-1]), "dense_kv_bytes": int(self.dense_kv_bytes[-1]),
                "read_bytes_per_step": int(np.median(self.read_bytes)) if len(self.read_bytes) else 0,
                "dense_read_bytes_per_step": int(np.median(self.dense_read_bytes))
                if len(self.dense_read_bytes) else 0,
                "kl": round(self.mean_kl, 6), "top1_agreement": round(self.top1_agreement, 4),
                "ppl": round(self.ppl, 4), "dense_ppl": round(self.dense_ppl, 4),
                "decode_ms": round(self.decode_ms, 3), "dense_decode_ms": round(self.dense_decode_ms, 3)}


def resolve(lm: LoadedModel, shrink: Shrink, prompt_tokens: int, length: int) -> int:
    """The budget as a count (budget.py says what it counts for each method): a latent rank;
    keys per head at the last step (of `length` cached); tokens held."""
    if shrink.method == "latent":
        return shrink.budget.of(full_rank(lm))
    if shrink.method in SPARSE_METHODS:
        return shrink.budget.of(length)
    if shrink.budget.full:
        return length
    return shrink.budget.of(prompt_tokens) if shrink.budget.percent else int(shrink.budget.value)


def _sparse_k(shrink: Shrink, cached: int) -> int:
    return cached if shrink.budget.full else shrink.budget.of(cached)


def _cache(lm: LoadedModel, shrink: Shrink | None, count: int) -> DynamicCache:
    cache = DynamicCache(config=lm.model.config)
    if shrink is None or shrink.budget.full:
        return cache
    layers = lm.model.config.num_hidden_layers
    if shrink.method == "latent":
        return latent_cache(lm, count)
    if shrink.method == "indexer":
        cache.layers = [IndexedLayer(p) for p in indexer_projections(lm)]
    elif shrink.method in TOKEN_METHODS:
        cache.layers = [EvictLayer(shrink.method, count, lm.spec.kv_heads) for _ in range(layers)]
    return cache


def _read_bytes(cache: DynamicCache) -> int:
    return sum(cache_layer_bytes(cache))


@torch.inference_mode()
def teacher_forced(lm: LoadedModel, ids: list[int], n_prompt: int, shrink: Shrink | None,
                   record_layer: int | None = None, stop: threading.Event | None = None,
                   done: Callable[[float], None] = lambda fraction: None) -> Forced:
    """Prefill ids[:n_prompt], then one token at a time through the rest (None: unmodified);
    `done(fraction of the tokens read)` after each forward."""
    count = resolve(lm, shrink, n_prompt, len(ids)) if shrink is not None else 0
    cache = _cache(lm, shrink, count)
    attend = None
    if shrink is not None and not shrink.budget.full and shrink.method != "latent":
        attend = ShrinkAttention(shrink.method, cache, lm.spec.kv_heads, count, record_layer)
    seq = torch.tensor([ids], device=lm.device)
    logps, held, read, times = [], [], [], []

    def forward(part: torch.Tensor):
        if attend is None:
            return lm.model(input_ids=part, cache=cache, use_cache=True, logits_to_keep=1)
        with overriding(lm.model, attend):
            return lm.model(input_ids=part, cache=cache, use_cache=True, logits_to_keep=1)

    out = forward(seq[:, :n_prompt])
    before = sample(lm)
    for i in range(n_prompt, len(ids) + 1):
        logps.append(torch.log_softmax(out.logits[0, -1].float(), -1).cpu())
        held.append(sum(cache_layer_bytes(cache)))
        if i == len(ids) or (stop is not None and stop.is_set()):
            break
        if attend is not None:
            attend.read_bytes = 0
            if shrink.method in SPARSE_METHODS:
                attend.k = _sparse_k(shrink, i + 1)
        done(i / len(ids))
        start = clock_ms(lm.device)
        out = forward(seq[:, i:i + 1])
        times.append(clock_ms(lm.device) - start)
        read.append(attend.read_bytes if attend is not None and attend.read_bytes
                    else _read_bytes(cache))
    delayed = delayed_between(before, sample(lm), threads_used()) if times else None
    rows = None
    if attend is not None and attend.rows:
        width = max(r.shape[1] for r in attend.rows)
        rows = np.stack([np.pad(r, ((0, 0), (0, width - r.shape[1]))) for r in attend.rows])
    return Forced(tuple(logps), np.array(held), np.array(read), np.array(times), rows, delayed)



def held_out_sequence(lm: LoadedModel, prompt_tokens: int = HELD_OUT_PROMPT,
                      positions: int = HELD_OUT_POSITIONS) -> tuple[list[int], int]:
    """The held-out text's first `prompt_tokens` as the prompt and the next `positions` tokens
    to read: a text no calibration here saw (the latent's is the Declaration)."""
    ids = list(lm.tokenizer(read_text(HELD_OUT))["input_ids"])[:prompt_tokens + positions]
    return ids, prompt_tokens


def compare(lm: LoadedModel, ids: list[int], n_prompt: int, shrink: Shrink, dense: Forced,
            run: Forced, layer: int, source: str = "run") -> ShrinkRun:
    """The method's pass against the unmodified one, on the same ids."""
    n = min(len(dense.logps), len(run.logps))
    follow = ids[n_prompt:n_prompt + n - 1]
    nll = np.array([-float(run.logps[j][t]) for j, t in enumerate(follow)])
    dense_nll = np.array([-float(dense.logps[j][t]) for j, t in enumerate(follow)])
    kl = np.array([max(0.0, float((d.exp() * (d - r)).sum()))
                   for d, r in zip(dense.logps[:n], run.logps[:n])])
    agree = np.array([int(d.argmax()) == int(r.argmax())
                      for d, r in zip(dense.logps[:n], run.logps[:n])])
    return ShrinkRun(shrink.method, shrink.budget.text(), resolve(lm, shrink, n_prompt, len(ids)),
                     n_prompt,
                     kl, agree, nll, dense_nll, run.kv_bytes[:n], dense.kv_bytes[:n],
                     run.read_bytes[:n - 1], dense.read_bytes[:n - 1], run.step_ms[:n - 1],
                     dense.step_ms[:n - 1], layer, run.rows, source,
                     None if run.delayed is None and dense.delayed is None
                     else bool(run.delayed or dense.delayed))


def shrink_runs(lm: LoadedModel, ids: list[int], n_prompt: int, shrinks: list[Shrink],
                layer: int | None = None, max_tokens: int = 8192,
                stop: threading.Event | None = None, source: str = "run",
                say: Callable[[str, float], None] = lambda text, fraction: None):
    """The unmodified pass once, then each method: yields a ShrinkRun per method as it ends;
    `say(text, fraction done)` before each pass."""
    check_sequence(lm, ids, max_tokens)
    if not 1 <= n_prompt < len(ids):
        raise ValueError("the prompt must leave at least one token to predict")
    layer = lm.spec.layers // 2 if layer is None else layer
    passes = len(shrinks) + 1
    text = _("Reading the tokens with the unmodified model…")
    say(text, 0.0)
    dense = teacher_forced(lm, ids, n_prompt, None, stop=stop,
                           done=every_half_second(lambda f: say(text, f / passes)))
    for i, shrink in enumerate(shrinks, start=1):
        if stop is not None and stop.is_set():
            return
        text = _("Reading the tokens with {method} at a budget of {budget}…").format(
            method=_(METHODS[shrink.method]), budget=described_budget(shrink.budget.text()))
        say(text, i / passes)
        yield compare(lm, ids, n_prompt, shrink, dense,
                      teacher_forced(lm, ids, n_prompt, shrink, layer, stop,
                                     done=every_half_second(
                                         lambda f, i=i, text=text: say(text, (i + f) / passes))),
                      layer, source)


def every_half_second(tell: Callable[[float], None]) -> Callable[[float], None]:
    """`tell(fraction)`, at most twice a second (a progress bar, not every decode step)."""
    last = [0.0]

    def told(fraction: float) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5:
            last[0] = now
            tell(fraction)
    return told



def delayed_between(before: MachineSample, after: MachineSample, threads: int) -> bool | None:
    """The app's delay rule (engine/timing/disturbance.py `over_limits`) over a stretch of
    measured work. None where /proc says nothing or the stretch is under a clock tick."""
    others = others_share(before, after)
    wall = after.wall_ms - before.wall_ms
    if others is None or wall <= 0:
        return None
    return over_limits(others, (after.cpu_ms - before.cpu_ms) / (max(1, threads) * wall))


def sample(lm: LoadedModel) -> MachineSample:
    """Now, with the machine's tick counters read afresh (not the per-tick cache)."""
    return MachineSample.now(lm.device, fresh=True)


def threads_used() -> int:
    return max(1, min(torch.get_num_threads(), usable_cores()))
