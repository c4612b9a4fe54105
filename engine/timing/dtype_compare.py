"""float32, float16 and bfloat16 weights side by side: the same decode on this machine.

Why measured, not claimed: halving the bytes per weight halves what a decode step reads, but
whether a step gets faster depends on the CPU's kernels for the type (native fp16/bf16
arithmetic, or a conversion back to fp32 on every load). Each round decodes the same prompt
greedily in each dtype, one after the other (the order rotating from round to round, like the
kernel comparison of engine/kernels/compiled.py), so a drift of the shared machine touches all alike.
Each dtype runs on a copy of the loaded model's weights cast to it, made for its run and dropped
after it: at most one extra copy is alive at a time (none for the loaded model's own dtype). A
model opened from a GGUF file runs on its stored blocks, which have no float dtype to cast: it
is refused in one line (`DTYPES_MAPPED`) rather than copied.
"""

from __future__ import annotations

import copy
import gc
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from i18n import N_, _

from ..errors import EngineError, InputError
from ..forward import decode_one_token, prefill, timed_greedy
from ..loader import LoadedModel, is_mapped_model

DTYPES = ("float32", "float16", "bfloat16")
DTYPES_MAPPED = N_("The comparison casts copies of the float32 weights to float16 and bfloat16; a "
                   "model opened from a GGUF file runs on its stored blocks, with float32 "
                   "activations, and holds no float weights to cast: use the default model.")

Progress = Callable[[str, float], None]


@dataclass(frozen=True, slots=True)
class DtypeRun:
    dtype: str
    itl_ms: float  # median over rounds of each round's median decode step
    round_ms: tuple[float, ...]  # each round's median decode step, in round order
    ratio: float  # itl_ms / float32's itl_ms (< 1: faster than float32)
    same_tokens: bool  # greedy tokens == float32's, in every round
    tokens: tuple[int, ...]  # this dtype's greedy tokens (first round)


@dataclass(frozen=True, slots=True)
class DtypeComparison:
    prompt_tokens: int
    new_tokens: int
    rounds: int  # rounds completed (fewer than asked when stopped at a time budget)
    source_dtype: str  # the loaded weights every copy was cast from
    runs: tuple[DtypeRun, ...]  # float32 first

    def run(self, dtype: str) -> DtypeRun:
        return next(r for r in self.runs if r.dtype == dtype)


def cast_copy(model: Any, dtype: torch.dtype) -> Any:
    """A copy of `model` whose floating weights and buffers are `dtype`. Parameters are cast
    straight into the copy (deepcopy's memo): no intermediate copy in the old dtype; tied
    weights stay one tensor; a weight already in `dtype` is shared, not copied."""
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for p in model.parameters():  # each shared (tied) parameter once
            memo[id(p)] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
        for b in model.buffers():
            memo[id(b)] = b.to(dtype) if b.is_floating_point() else b
    clone = copy.deepcopy(model, memo)
    return clone.eval()


def _decode(lm: LoadedModel, model: Any, prompt_ids: list[int],
            new_tokens: int) -> tuple[list[int], list[float]]:
    """Untimed prefill, then `new_tokens` greedy tokens; each decode step's ms."""
    device = lm.device
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        first, _ = prefill(model, torch.tensor([prompt_ids], device=device), cache)

        def step(token: int, _i: int) -> torch.Tensor:
            return decode_one_token(model, torch.tensor([[token]], device=device), cache)[0]
        return timed_greedy(first, step, new_tokens, device)


def compare_dtypes(lm: LoadedModel, prompt_ids: Sequence[int], new_tokens: int = 16,
                   rounds: int = 3, dtypes: Sequence[str] = DTYPES,
                   say: Progress | None = None,
                   stop: Callable[[], bool] | None = None) -> DtypeComparison:
    """Paired, interleaved rounds: each round decodes `new_tokens` greedy tokens after the
    prompt in every dtype. `stop()` is checked after each round (a time budget): the rounds
    completed so far are reported (at least one)."""
    if is_mapped_model(lm.model):
        raise EngineError(_(DTYPES_MAPPED))
    if new_tokens < 2 or rounds < 1:
        raise InputError("the comparison needs at least 2 new tokens and 1 round")
    if not prompt_ids:
        raise InputError("the comparison needs a prompt of at least one token")
    names = ["float32"] + [d for d in dict.fromkeys(dtypes) if d != "float32"]
    unknown = set(names) - set(DTYPES)
    if unknown:
        raise InputError(f"unknown dtypes {sorted(unknown)}: use {', '.join(DTYPES)}")
    say = say or (lambda _text, _fraction: None)
    ids = list(prompt_ids)
    medians: dict[str, list[float]] = {name: [] for name in names}
    tokens: dict[str, tuple[int, ...]] = {}
    same = {name: True for name in names}
    done = 0
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for i, name in enumerate(order):
            say(f"Round {r + 1} of {rounds}: {name}…", (r + i / len(order)) / rounds)
            model = cast_copy(lm.model, getattr(torch, name))
            try:
                got, times = _decode(lm, model, ids, new_tokens)
            finally:
                del model
                gc.collect()
            medians[name].append(statistics.median(times))
            tokens.setdefault(name, tuple(got))
            same[name] = same[name] and tuple(got) == tokens[name]
        done = r + 1
        for name in names:  # against float32's tokens (every float32 round matched its first)
            same[name] = same[name] and tokens[name] == tokens["float32"]
        say(f"Round {done} of {rounds}: " + ", ".join(
            f"{name} {ms[-1]:.1f} ms" for name, ms in medians.items()) + " per token",
            done / rounds)
        if stop is not None and stop():
            break
    base = statistics.median(medians["float32"])
    runs = tuple(DtypeRun(name, statistics.median(ms), tuple(ms),
                          statistics.median(ms) / base, same[name], tokens[name])
                 for name, ms in medians.items())
    source = str(next(lm.model.parameters()).dtype).removeprefix("torch.")
    return DtypeComparison(len(ids), new_tokens, done, source, runs)

