"""The recorded run: a generator that yields each :class:`Step` the moment it is done.

A :class:`Run` strings engine/forward.py's plain functions together, checks a stop flag between
steps, and can hand out its (partial) :class:`Trace` any time. Each step is a few small jobs, one
function each: choose the decoder (once), run one forward, pick the token, measure the KV bytes,
build the Step. A decoder other than transformers plugs in through engine/decoders.py's
:class:`DecodeStep`.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

import numpy as np
import torch
from transformers import DynamicCache

from i18n import N_, _

from . import __version__
from .attention import AttentionRecorder, recorded_layers, recording
from .clock import MachineSample, clock_ms, load_average, others_share, usable_cores
from .decoders import DecoderSource, DecodeStep, native_cache_bytes
from .detok import IncrementalDetokenizer
from .errors import EngineError, InputError
from .forward import (
    cache_layer_bytes,
    decode_one_token,
    eos_token_ids,
    forward_full,
    prefill,
    prepare_prompt,
    special_ids,
)
from .loader import LoadedModel
from .records.trace import DecoderUsed, MachineLoad, Step, Trace
from .sampling import Choice, choose_token, top_choices
from .settings import FLOAT_WEIGHTS, GenerationSettings

# Why decode steps ran in torch, recorded in English (data); DecoderUsed.label translates it.
TORCH_ASKED_REASON = N_("the torch decoder was asked for")
KV_OFF_REASON = N_("the KV cache is off: the native step decodes against its cache")


def machine_load(first: MachineSample | None, last: MachineSample | None,
                 load_before: float | None) -> MachineLoad:
    """The machine around a run from its first to its last sample (engine/timing/disturbance.py
    says how it is read)."""
    whole = others_share(first, last) if first is not None and last is not None else None
    return MachineLoad(threads=torch.get_num_threads(), cores=usable_cores(),
                       load_before=load_before, load_after=load_average(), others_share=whole)


@dataclass(slots=True)
class _Loop:
    """What the step loop carries from one step to the next."""

    model: Any  # the torch model the forwards run on
    device: torch.device
    sequence: torch.Tensor  # (1, S): the prompt and every token chosen so far
    cache: DynamicCache | None  # None with the cache off, and once the native cache holds it
    generator: torch.Generator | None  # None when greedy
    recorder: AttentionRecorder | None
    detok: IncrementalDetokenizer
    eos: frozenset[int]


class Run:
    """One generation. Iterate it to run the steps; `trace()` returns what is done so far.

    The prefill runs in transformers (with attention and hidden states recorded as asked; with a
    plugged-in decoder, on `native.model`, the torch model holding its weights) — except with a
    decoder shared with other runs (a SharedStep: the server's batch), which runs the prompt in
    its batched forward and records what the recorder would.
    The decode steps run on `native` — a :class:`DecodeStep` (engine/kernels/native.py's
    NativeDecoder for this model's weights), or a function that builds one, called when the run
    starts — where it can run: `settings.decoder` is "native", the KV cache is on and prompt + new
    tokens fit its cache. Otherwise they run in transformers, and the trace keeps the one-line
    reason (`native_problem` when the caller could not build a decoder). `weights` names the
    variant `lm` holds (default: its dtype's, fp32 / fp16 / bf16); the bytes of weights recorded
    are what the decode steps read — `lm`'s tensors in torch (a quantized copy holds them
    dequantized, in float32), the packed codes and scales when the native step ran.
    """

    def __init__(self, lm: LoadedModel, prompt: str, settings: GenerationSettings | None = None,
                 stop_event: threading.Event | None = None, native: DecoderSource | None = None,
                 native_problem: str | None = None, weights: str | None = None) -> None:
        settings = settings or GenerationSettings()
        if not prompt or not prompt.strip():
            raise InputError(_("the prompt is empty"))
        start = time.perf_counter()
        ids = prepare_prompt(lm.tokenizer, prompt, settings.chat_template)
        self.tokenize_ms = (time.perf_counter() - start) * 1000.0
        _check_lengths(lm, settings, len(ids))
        if settings.seed is None:
            settings = settings.with_seed(random.randrange(2**31))
        self.recorded_layers = recorded_layers(lm.spec, settings, len(ids))
        self.lm, self.prompt, self.settings = lm, prompt, settings
        self.prompt_ids = ids
        self._prompt_view: tuple[tuple[str, ...], tuple[bool, ...]] | None = None
        self.steps: list[Step] = []
        self.stop_reason = "running"
        self.created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._stop = stop_event or threading.Event()
        self._load_before = load_average()
        self._first: MachineSample | None = None
        self._last: MachineSample | None = None
        self._native_source = native
        self.weights = weights or FLOAT_WEIGHTS.get(lm.spec.dtype, lm.spec.dtype)
        self._torch_bytes = lm.spec.weight_bytes  # what torch reads: the (dequantized) tensors
        self.native: DecodeStep | None = None
        problem = native_problem or self._static_problem()
        self._decided = problem is not None
        self.decoder = self._torch(problem or N_("the run has not started"))

    def _static_problem(self) -> str | None:
        """Why the native step will not run, as far as can be told before the run starts."""
        s = self.settings
        if s.decoder == "torch":
            return TORCH_ASKED_REASON
        if not s.kv_cache:
            return KV_OFF_REASON
        if self._native_source is None:
            return N_("no native decoder was given to this run")
        return None

    def _torch(self, reason: str) -> DecoderUsed:
        return DecoderUsed("torch", reason, self.weights, self._torch_bytes)

    def _choose_decoder(self) -> None:
        """Resolve the native decoder (building it if a function was given) and check it fits."""
        if self._decided:
            return
        self._decided = True
        source = self._native_source
        need = len(self.prompt_ids) + self.settings.max_new_tokens
        try:
            if hasattr(source, "admit"):  # a batcher seats the run for the positions it needs
                native = source.admit(need, self._stop)
            else:
                native = source() if callable(source) and not hasattr(source, "step") else source
        except EngineError as err:
            self.decoder = self._torch(str(err).splitlines()[0] if str(err) else N_("unavailable"))
            return
        if need > native.max_tokens:
            self.decoder = self._torch(
                _("prompt ({prompt}) + new tokens ({new}) exceed the native cache of {cache} "
                  "tokens").format(prompt=len(self.prompt_ids), new=self.settings.max_new_tokens,
                                   cache=native.max_tokens))
            return
        self.native = native
        self.decoder = DecoderUsed(getattr(native, "name", "native"), None, native.weights,
                                   int(native.weight_bytes))

    @property
    def _shared(self) -> bool:
        """Whether the decoder is shared with other runs (a SharedStep: it runs the prefill)."""
        return getattr(self.native, "joining", None) is not None

    def stop(self) -> None:
        """Ask the run to stop before its next step; what is done stays in the trace."""
        self._stop.set()

    def __iter__(self) -> Iterator[Step]:
        return self._steps()

    def run_all(self) -> Trace:
        for _step in self:
            pass
        return self.trace()

    def _steps(self) -> Iterator[Step]:
        self._choose_decoder()
        try:
            loop = self._start()
            for i in range(len(self.steps), self.settings.max_new_tokens):  # a branch: some done
                if self._stop.is_set():
                    self.stop_reason = "stopped"
                    return
                step = self._step(loop, i)
                self.steps.append(step)
                yield step
                if step.token_id in loop.eos:
                    self.stop_reason = "eos"
                    return
            self.stop_reason = "length"
        finally:
            release = getattr(self.native, "release", None)  # a batched decoder's place
            if release is not None:
                release()

    def _start(self) -> _Loop:
        """The loop's state before the prefill."""
        lm, s = self.lm, self.settings
        # The prefill runs on the weights the native step multiplies by (its variant's copy), so
        # the prompt's K/V and first token are those of the model the decode steps continue.
        model = self.native.model if self.native is not None else lm.model
        device = lm.device
        generator = None
        if not s.greedy:
            generator = torch.Generator(device=device).manual_seed(s.seed)
        recorder = None
        if self.recorded_layers:
            recorder = AttentionRecorder(layers=frozenset(self.recorded_layers))
        return _Loop(model, device, torch.tensor([self.prompt_ids], device=device),
                     DynamicCache(config=model.config) if s.kv_cache else None, generator,
                     recorder, IncrementalDetokenizer(lm.tokenizer), eos_token_ids(lm))

    def _step(self, loop: _Loop, i: int) -> Step:
        """Step i: one forward, the token chosen, the KV bytes after it, timed as a whole."""
        s, n_prompt = self.settings, len(self.prompt_ids)
        if loop.recorder is not None:  # after the prefill a step records its new token's row
            loop.recorder.last_query_only = i > 0 and (loop.cache is None or _uncached(loop) > 1)
        # A decoder shared with other runs (batched) records attention itself, the prefill's
        # too, and the model's attention is not switched around its steps (other runs' forwards
        # may be using the model); its prefill waits for the batch's turn in `joining`.
        shared = self._shared
        hooked = None if shared else loop.recorder
        joining = self.native.joining if shared and i == 0 else None
        with torch.inference_mode(), joining() if joining else nullcontext(), \
                recording(loop.model, hooked):
            # after the prefill's turn: waiting for it is not the step's time (as a run in the
            # turn does not count its wait in the queue); a batched decode step's wait for the
            # others' is (it is that run's time between tokens)
            before = MachineSample.now(loop.device)
            self._first = self._first or before
            logits, hidden, attention, batched = self._forward(loop, i)
            forward_ms = clock_ms(loop.device) - before.wall_ms
            if i == 0 and self.native is not None and not shared:
                self.native.load_prefix(loop.cache, n_prompt)  # the prompt's K/V, into its cache
            if not bool(torch.isfinite(logits).all()):  # damaged weights: no token to choose
                raise EngineError(_("the model's output holds NaN or infinite values at step "
                                    "{i} (its weights or settings are damaged): stopped").format(
                                        i=i))
            choice = getattr(batched, "choice", None)  # chosen with the rest of its batch
            if choice is None:
                token = choose_token(logits, s.temperature, s.top_k, s.top_p, loop.generator)
                probs = torch.softmax(logits.float(), dim=-1)  # (V,) the model's own distribution
                choice = top_choices(probs, token, s.record_top_k)
            token = choice.token
            if loop.recorder is not None and attention is None:
                attention = loop.recorder.take()
            hidden_np = hidden.float().cpu().numpy() if hidden is not None else None
        after = self._last = MachineSample.now(loop.device)
        token_tensor = torch.tensor([[token]], device=loop.device)
        loop.sequence = torch.cat([loop.sequence, token_tensor], dim=1)  # (1, S + 1)
        per_layer = self._kv_bytes(loop, i)
        if self.native is not None and i == 0:
            loop.cache = None  # the native cache holds the prompt from here on; drop the torch copy
        last = token in loop.eos or i == s.max_new_tokens - 1
        text = loop.detok.push(token) + (loop.detok.flush() if last else "")
        if batched is not None:  # the run's step waited for the batch: its forward alone
            forward_ms = min(batched.forward_ms, forward_ms)
        return self._record(i, choice, text, per_layer, before, after, forward_ms,
                            attention.numpy() if attention is not None else None, hidden_np,
                            batched.batch if batched is not None else 1)

    def _forward(self, loop: _Loop, i: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                                     torch.Tensor | None, Any]:
        """One forward: the prefill (i = 0), else a decode step on the chosen decoder.
        Returns logits (V,), hidden (L + 1, hidden) or None, the attention the decoder
        recorded itself, (L_rec, H, 1, S) float16, or None (the recorder holds it), and a
        batched decoder's output (its batch size and forward time), else None."""
        s = self.settings
        greedy_top_k = s.record_top_k if s.greedy and self._shared else None
        if i == 0 and self._shared:  # the prompt in the batch's forward: (L_rec, H, T, T)
            done = self.native.prefill(self.prompt_ids, self.recorded_layers, s.record_hidden,
                                       greedy_top_k)
            attention = done.attention
            if attention is not None:
                attention = attention.to(device="cpu", dtype=torch.float16)
            return done.logits, done.hidden, attention, done
        if i == 0:
            return (*prefill(loop.model, loop.sequence, loop.cache, s.record_hidden), None, None)
        if self.native is not None:
            more = {"greedy_top_k": greedy_top_k} if greedy_top_k is not None else {}
            done = self.native.step(int(loop.sequence[0, -1]), len(self.prompt_ids) + i - 1,
                                    attention_layers=self.recorded_layers,
                                    hidden=s.record_hidden, **more)
            attention = done.attention
            if attention is not None:  # (L_rec, H, S) → (L_rec, H, 1, S), as recorded
                attention = attention[:, :, None].to(torch.float16)
            return (done.logits, done.hidden, attention,
                    done if hasattr(done, "batch") else None)
        if loop.cache is not None:  # the positions the cache lacks: one, except in a re-run
            fed = loop.sequence[:, loop.sequence.shape[1] - _uncached(loop):]  # (1, T)
            return (*decode_one_token(loop.model, fed, loop.cache, s.record_hidden), None, None)
        return (*forward_full(loop.model, loop.sequence, s.record_hidden), None, None)

    def _kv_bytes(self, loop: _Loop, i: int) -> tuple[int, ...]:
        """Per layer, the KV cache's bytes after step i: measured from the torch cache's tensors,
        or what the same positions take in one while the native cache holds them."""
        if self.native is not None and (i > 0 or self._shared):
            return native_cache_bytes(self.lm.spec, len(self.prompt_ids) + i)
        if loop.cache is None:
            return (0,) * self.lm.spec.layers
        return cache_layer_bytes(loop.cache)

    def _record(self, i: int, choice: Choice, text: str, per_layer: tuple[int, ...],
                before: MachineSample, after: MachineSample, forward_ms: float,
                attention: np.ndarray | None, hidden: np.ndarray | None, batch: int = 1) -> Step:
        """Step i as the trace keeps it (`batch`: the runs its forward served)."""
        tokenizer, n_prompt = self.lm.tokenizer, len(self.prompt_ids)
        return Step(
            index=i, phase="prefill" if i == 0 else "decode", token_id=choice.token,
            piece=tokenizer.convert_ids_to_tokens(choice.token), text=text,
            position=n_prompt + i, context_len=n_prompt + i,
            latency_ms=after.wall_ms - before.wall_ms,
            kv_bytes=sum(per_layer), kv_bytes_per_layer=per_layer,
            top_ids=choice.top_ids, top_probs=choice.top_probs,
            top_pieces=tuple(tokenizer.convert_ids_to_tokens(choice.top_ids.tolist())),
            chosen_prob=choice.prob, chosen_rank=choice.rank,
            attention=attention, hidden=hidden,
            forward_ms=forward_ms, cpu_ms=after.cpu_ms - before.cpu_ms,
            others_share=others_share(before, after), batch=batch)

    def trace(self) -> Trace:
        """The trace so far; a run stopped or still going keeps every finished step. (A live
        page asks for it at every step: the prompt's pieces are looked up once.)"""
        if self._prompt_view is None:
            tok = self.lm.tokenizer
            special = special_ids(tok)
            self._prompt_view = (tuple(tok.convert_ids_to_tokens(self.prompt_ids)),
                                 tuple(i in special for i in self.prompt_ids))
        pieces, specials = self._prompt_view
        return Trace(
            model=self.lm.spec, settings=self.settings, prompt=self.prompt,
            prompt_token_ids=tuple(self.prompt_ids),
            prompt_pieces=pieces, prompt_special=specials,
            steps=tuple(self.steps), stop_reason=self.stop_reason,
            tokenize_ms=self.tokenize_ms, device=str(self.lm.device),
            attention_layers=self.recorded_layers, created_at=self.created_at,
            engine_version=__version__, machine=self.machine_load(), decoder=self._used())

    def _used(self) -> DecoderUsed:
        """The decoder record: a finished run whose only step was the prefill decoded nothing
        natively, whatever was chosen."""
        if self.decoder.name == "native" and len(self.steps) <= 1 and self.stop_reason != "running":
            return self._torch(N_("no decode step ran: the run ended with the prefill's token"))
        return self.decoder

    def machine_load(self) -> MachineLoad:
        """The machine around the run so far."""
        return machine_load(self._first, self._last, self._load_before)


def _uncached(loop: _Loop) -> int:
    """Tokens of the sequence the cache holds no keys and values for (1 in a plain run's decode
    step; a branch re-run from nothing starts with its whole prefix)."""
    return loop.sequence.shape[1] - loop.cache.get_seq_length()


def _check_lengths(lm: LoadedModel, settings: GenerationSettings, prompt_len: int) -> None:
    """Refuse a prompt over the limit, a run past the model's context, or attention layers the
    model does not have (InputError, one line)."""
    if prompt_len > settings.max_prompt_tokens:
        raise InputError(_("the prompt is {n} tokens; the limit is {limit}").format(
            n=prompt_len, limit=settings.max_prompt_tokens))
    if lm.spec.max_context and prompt_len + settings.max_new_tokens > lm.spec.max_context:
        raise InputError(_("prompt ({prompt}) + new tokens ({new}) exceed the model's context of "
                           "{context} tokens").format(prompt=prompt_len, new=settings.max_new_tokens,
                                                      context=lm.spec.max_context))
    layers = settings.attention_layers
    if layers is not None and any(not 0 <= k < lm.spec.layers for k in layers):
        raise InputError(_("attention layers must be between 0 and {last}").format(
            last=lm.spec.layers - 1))


def generate_trace(lm: LoadedModel, prompt: str, settings: GenerationSettings | None = None) -> Trace:
    """Run a whole generation and return its trace (no streaming)."""
    return Run(lm, prompt, settings).run_all()
