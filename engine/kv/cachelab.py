"""KV-cache experiments on the loaded model: what each cache variant costs in memory and quality,
and what turning the cache off costs in time.

Quality is measured by teacher forcing: the full-cache run's tokens are fed to every variant, and
at each step the variant's next-token distribution is compared with the full cache's (KL
divergence, and whether the most probable token agrees).

Time is measured as the timing sweeps measure it (engine/timing/sweeps.py): every output length
runs in several rounds, each round visiting every length with the cache on and then off, so a
slow moment of a shared machine touches every length alike; a length reports the median of its
rounds and their min–max, and each run is checked by the delay rule
(engine/timing/disturbance.py). A longer output that took less time than a shorter one gets a
note saying why (`on_off_notes`).
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from i18n import _

from ..errors import InputError
from ..forward import cache_layer_bytes
from ..loader import LoadedModel
from ..records.trace import Trace
from ..runner import Run
from ..settings import GenerationSettings
from ..timing.disturbance import advice, assess
from .kvcache import CacheConfig, build_cache


@dataclass(frozen=True, slots=True, eq=False)
class VariantRun:
    config: CacheConfig
    kl: np.ndarray  # (steps,) KL(full ‖ variant) in nats
    agree: np.ndarray  # (steps,) bool: same most probable token as the full cache
    kv_bytes: np.ndarray  # (steps,) bytes held after each step

    @property
    def agreement(self) -> float:
        return float(self.agree.mean()) if len(self.agree) else 1.0


def check_sequence(lm: LoadedModel, ids: list[int], max_tokens: int) -> None:
    """Refuse, with one line, a token sequence the model should not be run on here: longer than
    this app's limit or the model's context, or with ids outside its vocabulary."""
    if len(ids) > max_tokens:
        raise InputError(_("this trace has {tokens:,} tokens; experiments here run the model on "
                           "at most {limit:,}").format(tokens=len(ids), limit=max_tokens))
    if lm.spec.max_context and len(ids) > lm.spec.max_context:
        raise InputError(_("this trace has {tokens:,} tokens, more than the model's context of "
                           "{context:,}").format(tokens=len(ids), context=lm.spec.max_context))
    if any(not 0 <= i < lm.spec.vocab_size for i in ids):
        raise InputError(_("this trace has token ids outside the loaded model's vocabulary"))


@torch.inference_mode()
def _teacher_forced(lm: LoadedModel, ids: list[int], n_prompt: int, config: CacheConfig
                    ) -> tuple[list[torch.Tensor], list[int]]:
    cache = build_cache(lm.model, config)
    seq = torch.tensor([ids], device=lm.device)
    logps, sizes = [], []
    out = lm.model(input_ids=seq[:, :n_prompt], cache=cache, use_cache=True, logits_to_keep=1)
    for i in range(n_prompt, len(ids) + 1):
        logps.append(torch.log_softmax(out.logits[0, -1].float(), -1))
        sizes.append(sum(cache_layer_bytes(cache)))
        if i < len(ids):
            out = lm.model(input_ids=seq[:, i:i + 1], cache=cache, use_cache=True, logits_to_keep=1)
    return logps, sizes


def compare_caches(lm: LoadedModel, prompt_ids: list[int], output_ids: list[int],
                   configs: list[CacheConfig], max_tokens: int = 4096) -> Iterator[VariantRun]:
    """The full cache first, then each variant, on the same token sequence (at most `max_tokens`
    of it: a longer one is refused, since each variant reruns it token by token)."""
    ids = list(prompt_ids) + list(output_ids[:-1])
    check_sequence(lm, ids, max_tokens)
    ref, ref_sizes = _teacher_forced(lm, ids, len(prompt_ids), CacheConfig())
    yield VariantRun(CacheConfig(), np.zeros(len(ref)), np.ones(len(ref), dtype=bool),
                     np.array(ref_sizes))
    for config in configs:
        logps, sizes = _teacher_forced(lm, ids, len(prompt_ids), config)
        kl = np.array([float((r.exp() * (r - v)).sum()) for r, v in zip(ref, logps)])
        agree = np.array([int(r.argmax()) == int(v.argmax()) for r, v in zip(ref, logps)])
        yield VariantRun(config, kl, agree, np.array(sizes))




ROUNDS = 3  # rounds per length: enough for a median and a spread
WARMUP_TOKENS = 2  # the untimed warm-up run's length (with the cache and without)


@dataclass(frozen=True, slots=True, eq=False)
class TimedRun:
    """One timed generation of the on/off experiment."""

    new_tokens: int
    round: int  # 0-based
    kv_cache: bool
    step_ms: np.ndarray  # (steps,) each step's wall time
    tokens: tuple[int, ...]
    delayed: bool | None  # the delay rule marked some of its steps; None: no step measured

    @property
    def total_ms(self) -> float:
        return float(self.step_ms.sum())


@dataclass(frozen=True, slots=True, eq=False)
class OnOff:
    """One output length with the cache and without it, over one or more interleaved rounds.

    `on_ms` / `off_ms`: each step's time in the round whose total is the (lower) median — what
    the per-step chart draws. `on_rounds_ms` / `off_rounds_ms`: every round's total, in the order
    measured (empty in a record of one round: its total is the sum of the steps).
    `on_delayed` / `off_delayed`: per round, whether other work delayed it (empty: not measured).
    """

    new_tokens: int
    on_ms: np.ndarray
    off_ms: np.ndarray
    same_tokens: bool
    on_rounds_ms: tuple[float, ...] = ()
    off_rounds_ms: tuple[float, ...] = ()
    on_delayed: tuple[bool, ...] = ()
    off_delayed: tuple[bool, ...] = ()

    def totals(self, cache: bool) -> tuple[float, ...]:
        """Each round's total time, with the cache (`cache` True) or without."""
        rounds = self.on_rounds_ms if cache else self.off_rounds_ms
        return rounds or (float((self.on_ms if cache else self.off_ms).sum()),)

    def median_ms(self, cache: bool) -> float:
        return float(statistics.median(self.totals(cache)))

    def spread_ms(self, cache: bool) -> tuple[float, float]:
        """(fastest, slowest) round."""
        totals = self.totals(cache)
        return min(totals), max(totals)

    @property
    def rounds(self) -> int:
        return len(self.totals(True))

    @property
    def measured(self) -> bool:
        """Whether each round was checked by the delay rule (not in a record of one round)."""
        return bool(self.on_delayed) and bool(self.off_delayed)

    def delayed(self, cache: bool) -> int:
        """How many rounds with the cache (or without) the delay rule marked."""
        return sum(self.on_delayed if cache else self.off_delayed)

    @property
    def delayed_rounds(self) -> int:
        """Rounds in which the run with the cache or the one without was delayed."""
        return sum(a or b for a, b in zip(self.on_delayed, self.off_delayed))

    @property
    def speedup(self) -> float:
        """Median time without the cache ÷ median time with it."""
        return self.median_ms(False) / self.median_ms(True)


def delay_flag(trace: Trace) -> bool | None:
    """Whether the delay rule (engine/timing/disturbance.py) marks any step of a run; None when
    no step was measured (a step shorter than a clock tick has no machine share)."""
    if not any(s.cpu_ms is not None and s.others_share is not None for s in trace.steps):
        return None
    return assess(trace).disturbed


def cache_on_off(lm: LoadedModel, prompt: str, lengths: Sequence[int],
                 max_prompt_tokens: int = 2048, max_new_tokens: int = 4096,
                 stop: threading.Event | None = None, rounds: int = ROUNDS) -> Iterator[TimedRun]:
    """Generate the same greedy tokens with the cache and without it: `rounds` rounds, each
    running every length (in the order given) with the cache on, then off. An untimed warm-up
    run of `WARMUP_TOKENS` tokens each way comes first (a process's first forwards of a shape pay
    one-time costs). Each run is yielded as it ends (`on_off_results` turns them into one result
    per length); once `stop` is set (a time budget), the run it cut is not reported."""
    if not lengths or any(not 1 <= n <= max_new_tokens for n in lengths):
        raise InputError(_("output lengths must be between 1 and {limit} tokens here").format(
            limit=max_new_tokens))
    if rounds < 1:
        raise InputError(_("the experiment needs at least one round"))

    def run(n: int, kv: bool):
        settings = GenerationSettings(max_new_tokens=n, kv_cache=kv, record_attention=False,
                                      record_hidden=False, max_prompt_tokens=max_prompt_tokens)
        return Run(lm, prompt, settings, stop_event=stop).run_all()

    for kv in (True, False):
        if run(min(WARMUP_TOKENS, *lengths), kv).stop_reason == "stopped":
            return
    for r in range(rounds):
        for n in lengths:
            for kv in (True, False):
                trace = run(n, kv)
                if trace.stop_reason == "stopped":
                    return
                yield TimedRun(n, r, kv, np.array([s.latency_ms for s in trace.steps]),
                               trace.output_token_ids, delay_flag(trace))


def _median_run(runs: list[TimedRun]) -> TimedRun:
    return sorted(runs, key=lambda t: t.total_ms)[(len(runs) - 1) // 2]


def on_off_results(runs: Iterable[TimedRun]) -> tuple[OnOff, ...]:
    """One result per length (in the order first measured) from its complete rounds — a round
    counts once both its runs ended; a length with none is left out."""
    found: dict[int, dict[int, dict[bool, TimedRun]]] = {}
    for t in runs:
        found.setdefault(t.new_tokens, {}).setdefault(t.round, {})[t.kv_cache] = t
    results = []
    for n, by_round in found.items():
        done = [pair for _round, pair in sorted(by_round.items()) if len(pair) == 2]
        if not done:
            continue
        on, off = [pair[True] for pair in done], [pair[False] for pair in done]
        measured = all(t.delayed is not None for t in on + off)
        results.append(OnOff(
            n, _median_run(on).step_ms, _median_run(off).step_ms,
            all(a.tokens == b.tokens for a, b in zip(on, off)),
            tuple(t.total_ms for t in on), tuple(t.total_ms for t in off),
            tuple(bool(t.delayed) for t in on) if measured else (),
            tuple(bool(t.delayed) for t in off) if measured else ()))
    return tuple(results)


def _why(shorter: OnOff, longer: OnOff, cache: bool) -> str:
    """Why a longer output's median came out below a shorter one's, in the order the reasons
    are checked: too few rounds, delayed rounds, overlapping spreads, none of these."""
    if min(shorter.rounds, longer.rounds) < 2:
        return _("a single round was measured, so this machine's noise cannot be told apart from "
                 "the model")
    delayed = shorter.delayed(cache) + longer.delayed(cache)
    if delayed:
        return _("other work on this machine delayed {delayed} of these {rounds} rounds, so "
                 "their times show the machine, not the model").format(
            delayed=delayed, rounds=shorter.rounds + longer.rounds)
    if longer.spread_ms(cache)[1] >= shorter.spread_ms(cache)[0]:
        return _("the difference is within the spread of the rounds (their min–max ranges "
                 "overlap): this machine's noise is larger than it")
    return _("no round was marked delayed and the ranges do not overlap: the machine's speed "
             "changed between the runs in a way the delay rule does not catch, so this pair is "
             "not to be trusted")


def on_off_notes(results: Sequence[OnOff], shared: bool = False) -> list[str]:
    """One line for each output length whose median time is below the next shorter length's
    (with the cache or without): more tokens never take less time, so the line says why the
    measurement shows it, and what to do."""
    ordered = sorted(results, key=lambda r: r.new_tokens)
    notes = []
    for cache in (True, False):
        for shorter, longer in zip(ordered, ordered[1:]):
            if longer.median_ms(cache) < shorter.median_ms(cache):
                line = (_("{longer} tokens took less time than {shorter} with the cache "
                          "({longer_ms:,.0f} ms vs {shorter_ms:,.0f} ms, medians): {why}. {advice}")
                        if cache else
                        _("{longer} tokens took less time than {shorter} without the cache "
                          "({longer_ms:,.0f} ms vs {shorter_ms:,.0f} ms, medians): {why}. {advice}"))
                notes.append(line.format(
                    longer=longer.new_tokens, shorter=shorter.new_tokens,
                    longer_ms=longer.median_ms(cache), shorter_ms=shorter.median_ms(cache),
                    why=_why(shorter, longer, cache), advice=advice(shared)))
    return notes
