"""Branch a generation at any of its tokens: the same prompt and tokens up to the branch point,
then another token there, then the model's own choices again — recorded as a run of its own.

The lesson is the KV cache's: the keys and values of the prompt and of the tokens before the
branch point do not change when a later token does, so a branch starts from its parent's cache
cut back to that point and computes only its own tokens — no prefill. `branch()` times that and,
for comparison, the same branch recomputed from nothing (a prefill of prompt + prefix + the new
token, then the same steps, recorded alike), and says whether both chose the same tokens.

A run's cache is kept as a `KVSnapshot` (plain tensors, so a session's memory budget counts
them); a Generate run's own cache is not kept (its decode steps may run in the native step), so
`run_snapshot` rebuilds it once with one prefill of the run's tokens, as a server keeping the
conversation would hold it.

Shapes: P prompt tokens, K tokens kept before the branch point, N output tokens in all,
KVH key/value heads, d head dimension.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import DynamicCache

from ..clock import clock_ms
from ..errors import InputError
from ..forward import decode_one_token, eos_token_ids, prefill
from ..loader import LoadedModel
from ..records.trace import BranchOf, Step, Trace
from ..runner import Run, _Loop
from ..settings import GenerationSettings

BRANCH_REASON = "a branch continues in torch from its parent's cached keys and values"


@dataclass(frozen=True, slots=True, eq=False)
class KVSnapshot:
    """A run's keys and values, per layer (1, KVH, positions, d), for branches to start from."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def positions(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.keys, *self.values))

    @classmethod
    def of(cls, cache: Any) -> "KVSnapshot":
        return cls(tuple(layer.keys for layer in cache.layers),
                   tuple(layer.values for layer in cache.layers))

    def restore(self, config: Any, positions: int) -> DynamicCache:
        """A new cache holding the first `positions` positions (the snapshot is not changed:
        the cache's next update concatenates into new tensors)."""
        if not 0 <= positions <= self.positions:
            raise InputError(f"the cache holds {self.positions} positions, not {positions}")
        cache = DynamicCache(config=config)
        if positions:
            for i, (k, v) in enumerate(zip(self.keys, self.values)):
                cache.update(k[:, :, :positions], v[:, :, :positions], i)
        return cache


@torch.inference_mode()
def run_snapshot(lm: LoadedModel, trace: Trace) -> tuple[KVSnapshot, float]:
    """The cache a run ends with (prompt + every output token but the last, which was never
    fed), built by one prefill, and its ms."""
    ids = [*trace.prompt_token_ids, *trace.output_token_ids[:-1]]
    start = clock_ms(lm.device)
    cache = DynamicCache(config=lm.model.config)
    prefill(lm.model, torch.tensor([ids], device=lm.device), cache)
    return KVSnapshot.of(cache), clock_ms(lm.device) - start


def check_branch_point(parent: Trace, at: int, token: int) -> None:
    out = parent.output_token_ids
    if not 0 <= at < len(out):
        raise InputError(f"--at {at} is not a generated token's index: the run has {len(out)} "
                         f"tokens (0 … {len(out) - 1})")
    if not 0 <= token < parent.model.vocab_size:
        raise InputError(f"token id {token} is outside the vocabulary "
                         f"(0 … {parent.model.vocab_size - 1})")
    if out[at] == token:
        raise InputError(f"token {token} is the one the run chose at {at}: pick another")


@torch.inference_mode()
def branch_point(lm: LoadedModel, parent: Trace, at: int, token: int,
                 snapshot: KVSnapshot) -> tuple[Step, int]:
    """The branch's step `at`: the parent's record (the same forward, the same distribution)
    with `token` chosen. A token outside the recorded top-k needs the whole distribution for its
    probability and rank: the parent's forward at that step is run again (1 forward, returned)."""
    step = parent.steps[at]
    piece = lm.tokenizer.convert_ids_to_tokens(token)
    listed = [j for j, i in enumerate(step.top_ids.tolist()) if i == token]
    if listed:
        prob = float(step.top_probs[listed[0]])
        rank, extra = int((step.top_probs > prob).sum()), 0
    else:
        before = [*parent.prompt_token_ids, *parent.output_token_ids[:at]]  # P + K ids
        cache = snapshot.restore(lm.model.config, len(before) - 1)
        logits, _ = decode_one_token(lm.model, torch.tensor([before[-1:]], device=lm.device),
                                     cache)
        probs = torch.softmax(logits.float(), -1)  # (V,)
        prob, rank, extra = float(probs[token]), int((probs > probs[token]).sum()), 1
    return replace(step, token_id=token, piece=piece, chosen_prob=prob, chosen_rank=rank), extra


class BranchRun(Run):
    """A Run that starts with its parent's steps up to the branch point (`point`: step K) and a
    cache of `reuse` positions (P + K: a branch; 0: the same branch recomputed), then decodes as
    any run does — on the native step when one is given and fits (its cache is loaded with the
    reused positions: no prefill), else in torch — recording the same things."""

    def __init__(self, lm: LoadedModel, parent: Trace, point: Step,
                 snapshot: KVSnapshot | None, reuse: int, weights: str | None = None,
                 stop_event: Any = None, new_tokens: int | None = None,
                 native: Any = None) -> None:
        settings = replace(parent.settings, kv_cache=True,
                           max_new_tokens=new_tokens or parent.settings.max_new_tokens)
        super().__init__(lm, parent.prompt, settings, stop_event, native=native,
                         native_problem=None if native is not None else BRANCH_REASON,
                         weights=weights)
        if tuple(self.prompt_ids) != parent.prompt_token_ids:
            raise InputError("this model tokenizes the run's prompt differently: branch it on "
                             "the model that made it")
        self.recorded_layers = parent.attention_layers
        self.steps = [*parent.steps[:point.index], point]
        self._snapshot, self._reuse = snapshot, reuse
        self.loop: _Loop | None = None

    def _start(self) -> _Loop:
        loop = super()._start()
        kept = [s.token_id for s in self.steps]
        loop.sequence = torch.tensor([[*self.prompt_ids, *kept]], device=loop.device)
        loop.cache = (self._snapshot.restore(loop.model.config, self._reuse)
                      if self._snapshot is not None else DynamicCache(config=loop.model.config))
        for token in kept:
            loop.detok.push(token)
        self.loop = loop
        return loop

    def _forward(self, loop: _Loop, i: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                                     torch.Tensor | None, Any]:
        """The first step after the branch point, with the native step: the positions the
        reused cache lacks run in torch (none in a branch but its new token, which the native
        step feeds; prompt + prefix + token in a re-run), then the native cache takes over."""
        if self.native is None or loop.cache is None:
            return super()._forward(loop, i)
        cache, loop.cache = loop.cache, None
        held = cache.get_seq_length()
        if loop.sequence.shape[1] - held > 1:  # a re-run: the prefill of everything so far
            out = decode_one_token(loop.model, loop.sequence[:, held:], cache,
                                   self.settings.record_hidden)
            self.native.load_prefix(cache, loop.sequence.shape[1])
            return (*out, None, None)
        self.native.load_prefix(cache, held)
        return super()._forward(loop, i)

    def snapshot(self) -> KVSnapshot:
        """This run's keys and values as it ends: prompt + every token but the last."""
        n = len(self.prompt_ids) + len(self.steps) - 1
        if self.loop is not None and self.loop.cache is not None:
            return KVSnapshot.of(self.loop.cache)
        if self.loop is not None and self.native is not None:  # shared: copied out now
            return KVSnapshot(tuple(k[None, :, :n].clone() for k in self.native.keys),
                              tuple(v[None, :, :n].clone() for v in self.native.values))
        assert self._snapshot is not None
        return KVSnapshot.of(self._snapshot.restore(self.lm.model.config, n))

    def _steps(self):  # type: ignore[no-untyped-def]
        last = self.steps[-1]
        if last.token_id in eos_token_ids(self.lm):
            self.stop_reason = "eos"
            return iter(())
        if len(self.steps) >= self.settings.max_new_tokens:
            self.stop_reason = "length"
            return iter(())
        return super()._steps()


@dataclass(frozen=True, slots=True, eq=False)
class Branched:
    """A branch: its recorded run (with its `BranchOf`), and its own cache for branches of it."""

    trace: Trace
    snapshot: KVSnapshot


def branch(lm: LoadedModel, parent: Trace, at: int, token: int, snapshot: KVSnapshot,
           weights: str | None = None, stop_event: Any = None, native: Any = None) -> Branched:
    """`parent` with its token `at` replaced by `token`, continued as the parent's settings ask,
    from `snapshot` (the parent's cache: `run_snapshot`, or a branch's own); the same branch is
    then recomputed from nothing, on the same decoder, to time the difference. `native`: the
    native decoder for `lm`'s weights (or a function building it), as a Run takes it."""
    check_branch_point(parent, at, token)
    start = clock_ms(lm.device)
    point, extra = branch_point(lm, parent, at, token, snapshot)
    reuse = len(parent.prompt_token_ids) + at  # positions P + K
    run = BranchRun(lm, parent, point, snapshot, reuse, weights, stop_event, native=native)
    found = run.run_all()
    branch_ms = clock_ms(lm.device) - start
    own = run.snapshot()  # before the re-run overwrites a shared native cache
    cut = len(found.steps) if found.stop_reason == "stopped" else None  # as far as it got
    start = clock_ms(lm.device)
    again = BranchRun(lm, parent, point, None, 0, weights, stop_event, new_tokens=cut,
                      native=run.native).run_all()  # inside the same budget as the branch
    rerun_ms: float | None = clock_ms(lm.device) - start
    same = again.output_token_ids == found.output_token_ids
    if again.stop_reason == "stopped":  # the budget ran out: no full re-run to compare with
        rerun_ms, same = None, False
    computed = len(found.steps) - at - 1 + extra  # one forward per step after the point
    record = BranchOf(at, token, parent.output_token_ids, reuse, computed, branch_ms, rerun_ms,
                      same)
    return Branched(replace(found, branch=record), own)


def single_token(lm: LoadedModel, text: str) -> int:
    """The id of `text` if it is exactly one token of the vocabulary (InputError otherwise)."""
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = lm.tokenizer.convert_ids_to_tokens(ids)
        raise InputError(f"“{text}” is {len(ids)} tokens ({', '.join(pieces) or 'none'}), not "
                         "one: type a single token, or pick a candidate")
    return int(ids[0])


def greedy_settings(new_tokens: int, chat: bool) -> GenerationSettings:
    """What the CLI's runs use: greedy, torch, attention not recorded."""
    return GenerationSettings(max_new_tokens=new_tokens, temperature=0.0, chat_template=chat,
                              record_attention=False, record_hidden=False, decoder="torch",
                              seed=0)
