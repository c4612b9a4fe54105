"""A speculative run as a Trace: one Step per output token, the verify steps in `speculation`.

Every page, the file format and `show` read Traces, so a speculative run becomes one with the
least change: each output token stays one Step (its top-k, probability and rank are the model's
own, read from the verify forward's row that chose it), and `Trace.speculation` records the
verify steps. What a Step's times mean (docs/trace-format.md says the same):

- the first token of a forward (the prefill's, or a verify step's first) carries that forward's
  whole time: `latency_ms` from before its draft lookup to after its own bookkeeping,
  `forward_ms` the model forward of k + 1 positions;
- every further token of that verify step arrived with the first: its `latency_ms` is only its
  own bookkeeping after it (softmax, top-k, detokenizing: measured, well under a ms) and its
  `forward_ms` is 0 — no forward ran for it.

So the token times add up to the run's wall time (TPOT and tokens/s stay true) and the gaps are
the true arrival gaps; the gaps' median is not a per-step cost — `show` says so.
Attention and hidden states are not recorded: a verify forward scores several positions at once,
and the Step's one-query-row shapes do not describe it.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Iterator

import torch
from transformers import DynamicCache

from ..clock import MachineSample, load_average, others_share
from ..detok import IncrementalDetokenizer
from ..errors import InputError
from ..forward import cache_layer_bytes, eos_token_ids
from ..records.trace import DecoderUsed, MachineLoad, Speculation, Step, Trace
from ..runner import Run, machine_load
from ..sampling import top_choices
from ..settings import FLOAT_WEIGHTS, GenerationSettings
from .speculative import METHOD, check_options, verify_bursts

TORCH_REASON = "speculative decoding verifies its drafts in transformers (k + 1 positions a forward)"


class SpeculativeRun:
    """One speculative greedy generation. Iterate it for each Step as it is done; `trace()`
    gives the (partial) Trace any time, like engine.runner.Run.

    Greedy only (the acceptance rule is argmax equality) and KV cache on (verifying against a
    cache is the point); attention and hidden-state recording are switched off in the recorded
    settings. The prompt and limits are checked by Run's own constructor, so both paths refuse
    the same inputs with the same sentence."""

    def __init__(self, lm: Any, prompt: str, settings: GenerationSettings | None = None,
                 draft_tokens: int = 4, ngram: int = 3,
                 stop_event: threading.Event | None = None, weights: str | None = None) -> None:
        settings = settings or GenerationSettings()
        if not settings.greedy:
            raise InputError("speculative decoding here is greedy only: use temperature 0")
        if not settings.kv_cache:
            raise InputError("speculative decoding verifies drafts against the KV cache: "
                             "switch the cache on")
        check_options(draft_tokens, ngram)
        settings = replace(settings, record_attention=False, record_hidden=False)
        weights = weights or FLOAT_WEIGHTS.get(lm.spec.dtype, lm.spec.dtype)
        self._header = Run(lm, prompt, settings, native_problem=TORCH_REASON, weights=weights)
        self.lm, self.prompt, self.settings = lm, prompt, self._header.settings
        self.prompt_ids = self._header.prompt_ids
        self.draft_tokens, self.ngram = draft_tokens, ngram
        self.decoder = DecoderUsed("torch", TORCH_REASON, weights, lm.spec.weight_bytes)
        self.steps: list[Step] = []
        self.stop_reason = "running"
        self._stop = stop_event or threading.Event()
        self._proposed: list[int] = []
        self._accepted: list[int] = []
        self._emitted: list[int] = []
        self._verify_ms: list[float] = []
        self._complete = 0  # steps of whole bursts: a trace never shows half a verify step
        self._first: MachineSample | None = None
        self._last: MachineSample | None = None
        self._load_before = load_average()

    def stop(self) -> None:
        """Ask the run to stop before its next forward; what is done stays in the trace."""
        self._stop.set()

    def __iter__(self) -> Iterator[Step]:
        return self._steps()

    def run_all(self) -> Trace:
        for _ in self:
            pass
        return self.trace()

    def _steps(self) -> Iterator[Step]:
        lm, s, device = self.lm, self.settings, self.lm.device
        eos = eos_token_ids(lm)
        cache = DynamicCache(config=lm.model.config)
        bursts = verify_bursts(lm.model, self.prompt_ids, s.max_new_tokens, self.draft_tokens,
                               self.ngram, eos, device, self._stop, cache)
        detok = IncrementalDetokenizer(lm.tokenizer)
        while True:
            before = MachineSample.now(device)
            self._first = self._first or before
            burst = next(bursts, None)
            if burst is None:
                break
            per_position = [b // cache.get_seq_length() for b in cache_layer_bytes(cache)]
            with torch.inference_mode():
                probs = torch.softmax(burst.logits.float(), dim=-1)  # (tokens, V)
            for j, token in enumerate(burst.tokens):
                step = self._step(token, probs[j], per_position, detok, eos,
                                  burst.forward_ms if j == 0 else 0.0, before)
                self.steps.append(step)
                if j == len(burst.tokens) - 1:  # the burst is whole: count it before its last yield
                    if len(self.steps) > len(burst.tokens):  # not the prefill
                        self._proposed.append(burst.proposed)
                        self._accepted.append(burst.accepted)
                        self._emitted.append(len(burst.tokens))
                        self._verify_ms.append(burst.verify_ms)
                    self._complete = len(self.steps)
                yield step
                before = self._last
        tokens = self.steps
        if tokens and tokens[-1].token_id in eos:
            self.stop_reason = "eos"
        elif len(tokens) >= s.max_new_tokens:
            self.stop_reason = "length"
        else:
            self.stop_reason = "stopped"

    def _step(self, token: int, probs: torch.Tensor, per_position: list[int],
              detok: IncrementalDetokenizer, eos: frozenset[int], forward_ms: float,
              before: MachineSample) -> Step:
        """Output token i's Step: the model's own distribution (`probs`, (V,), the row that chose
        it), KV bytes for its context (the cache's measured bytes per position × positions), and
        its time from `before` (the burst's start for its first token, else the previous token's
        end) to the end of its bookkeeping."""
        lm, s, n, i = self.lm, self.settings, len(self.prompt_ids), len(self.steps)
        choice = top_choices(probs, token, s.record_top_k)
        per_layer = tuple(b * (n + i) for b in per_position)
        last = token in eos or i == s.max_new_tokens - 1
        fields = dict(
            index=i, phase="prefill" if i == 0 else "decode", token_id=token,
            piece=lm.tokenizer.convert_ids_to_tokens(token),
            text=detok.push(token) + (detok.flush() if last else ""),
            position=n + i, context_len=n + i, kv_bytes=sum(per_layer),
            kv_bytes_per_layer=per_layer, top_ids=choice.top_ids, top_probs=choice.top_probs,
            top_pieces=tuple(lm.tokenizer.convert_ids_to_tokens(choice.top_ids.tolist())),
            chosen_prob=choice.prob, chosen_rank=choice.rank, forward_ms=forward_ms)
        after = self._last = MachineSample.now(lm.device)
        return Step(**fields, latency_ms=after.wall_ms - before.wall_ms,
                    cpu_ms=after.cpu_ms - before.cpu_ms, others_share=others_share(before, after))

    def speculation(self) -> Speculation:
        return Speculation(METHOD, self.draft_tokens, self.ngram, tuple(self._proposed),
                           tuple(self._accepted), tuple(self._emitted), tuple(self._verify_ms))

    def trace(self) -> Trace:
        """The trace so far: every token of each finished verify step (a stopped run keeps them;
        mid-burst, the burst's tokens already yielded wait until its last is, so the record
        always adds up to the steps)."""
        partial = replace(self._header.trace(), steps=tuple(self.steps[:self._complete]),
                          stop_reason=self.stop_reason, decoder=self.decoder,
                          speculation=self.speculation())
        return replace(partial, machine=self._machine())

    def _machine(self) -> MachineLoad:
        return machine_load(self._first, self._last, self._load_before)
