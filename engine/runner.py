"""The instrumented generation loop: plain functions around the model, not `model.generate`.

`prefill()` runs the whole prompt once and fills the KV cache; `decode_one_token()` runs one token
against it; with the cache off, `forward_full()` recomputes the whole sequence every step. A
:class:`Run` strings them together as a generator that yields each :class:`Step` the moment it is
done, checks a stop flag between steps, and can hand out its (partial) :class:`Trace` any time.
"""

from __future__ import annotations

import os
import random
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import torch
from transformers import Cache, DynamicCache

from . import __version__
from .attention import AttentionRecorder, recording
from .detok import IncrementalDetokenizer
from .errors import EngineError, InputError
from .kv.kvcache import cache_layer_bytes
from .loader import LoadedModel
from .records.trace import DecoderUsed, MachineLoad, Step, Trace
from .sampling import choose_token
from .settings import FLOAT_WEIGHTS, GenerationSettings
from .spec import ModelSpec
from .timing.clock import MachineSample, clock_ms, load_average, others_share

if TYPE_CHECKING:  # the native module imports this one
    from .kernels.native import NativeDecoder

Forward = tuple[torch.Tensor, torch.Tensor | None]  # logits (V,), hidden (L+1, hidden) or None
TORCH_ASKED_REASON = "the torch decoder was asked for"
KV_OFF_REASON = "the KV cache is off: the native step decodes against its cache"


def prepare_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> list[int]:
    """Token ids of the prompt: wrapped in the model's chat template (as a user turn) by default."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def _forward(model: Any, input_ids: torch.Tensor, cache: Cache | None,
             want_hidden: bool) -> Forward:
    out = model(input_ids=input_ids, cache=cache, use_cache=cache is not None,
                output_hidden_states=want_hidden, logits_to_keep=1)
    hidden = None
    if want_hidden:
        hidden = torch.stack([h[0, -1] for h in out.hidden_states])  # (L+1, hidden)
    return out.logits[0, -1], hidden


def prefill(model: Any, prompt_ids: torch.Tensor, cache: Cache | None,
            want_hidden: bool = False) -> Forward:
    """One forward over the whole prompt (1, T); fills `cache` and returns the last logits."""
    return _forward(model, prompt_ids, cache, want_hidden)


def decode_one_token(model: Any, token: torch.Tensor, cache: DynamicCache,
                     want_hidden: bool = False) -> Forward:
    """One forward of a single token (1, 1) against the cache, which grows by one position."""
    return _forward(model, token, cache, want_hidden)


def forward_full(model: Any, all_ids: torch.Tensor, want_hidden: bool = False) -> Forward:
    """Cache off: recompute the whole sequence (1, S) to get the next token's logits."""
    return _forward(model, all_ids, None, want_hidden)


def eos_token_ids(lm: LoadedModel) -> frozenset[int]:
    ids: set[int] = set()
    configured = getattr(lm.model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if lm.tokenizer.eos_token_id is not None:
        ids.add(lm.tokenizer.eos_token_id)
    return frozenset(ids)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def timed_greedy(first_logits: torch.Tensor, step: Callable[[int, int], torch.Tensor],
                 new_tokens: int, device: torch.device) -> tuple[list[int], list[float]]:
    """A greedy continuation for timing a decode step: the first token from the prefill's logits,
    then `step(token, i)` → (V,) logits for decode step i. Returns the tokens and each step's ms
    (synchronized clock). Shared by the compiled and the native decoder's comparisons."""
    token = int(first_logits.argmax())
    tokens, times = [token], []
    for i in range(new_tokens - 1):
        start = clock_ms(device)
        token = int(step(token, i).argmax())
        times.append(clock_ms(device) - start)
        tokens.append(token)
    return tokens, times


def recorded_layers(spec: ModelSpec, settings: GenerationSettings, prompt_len: int) -> tuple[int, ...]:
    """Which layers' attention to keep: the requested ones, or as many evenly spaced layers as fit
    the budget for the prefill matrices (layers · heads · T² · 2 bytes, float16)."""
    if not settings.record_attention:
        return ()
    if settings.attention_layers is not None:
        return settings.attention_layers
    per_layer = spec.heads * prompt_len * prompt_len * 2
    fit = max(1, min(spec.layers, settings.attention_budget_mb * 2**20 // max(per_layer, 1)))
    return tuple(sorted({round(i * (spec.layers - 1) / max(fit - 1, 1)) for i in range(fit)}))


def native_cache_bytes(spec: ModelSpec, positions: int) -> tuple[int, ...]:
    """Per layer, the bytes a transformers DynamicCache holds for `positions` cached tokens —
    2 (K and V) · kv_heads · positions · head_dim · bytes per value — so a run decoded by the
    native step reports the same KV figure as one decoded in torch (its own cache is
    preallocated to its max_tokens; this counts what is in use, the same positions)."""
    return (2 * spec.kv_heads * positions * spec.head_dim * spec.dtype_bytes,) * spec.layers


class Run:
    """One generation. Iterate it to run the steps; `trace()` returns what is done so far.

    The prefill always runs in transformers (with attention and hidden states recorded as asked;
    with a native decoder, on `native.model`, the torch model holding its weights).
    The decode steps run on `native` — a NativeDecoder (engine/kernels/native.py) for this model's
    weights, or a function that builds one, called when the run starts — where it can run:
    `settings.decoder` is "native", the KV cache is on and prompt + new tokens fit its cache.
    Otherwise they run in transformers, and the trace keeps the one-line reason (`native_problem`
    when the caller could not build a decoder). `weights` names the variant `lm` holds (default:
    its dtype's, fp32 / fp16 / bf16); the bytes of weights recorded are what the decode steps
    read — `lm`'s tensors in torch (a quantized copy holds them dequantized, in float32), the
    packed codes and scales when the native step ran.
    """

    def __init__(self, lm: LoadedModel, prompt: str, settings: GenerationSettings | None = None,
                 stop_event: threading.Event | None = None, native: Any = None,
                 native_problem: str | None = None, weights: str | None = None) -> None:
        settings = settings or GenerationSettings()
        if not prompt or not prompt.strip():
            raise InputError("the prompt is empty")
        start = time.perf_counter()
        ids = prepare_prompt(lm.tokenizer, prompt, settings.chat_template)
        self.tokenize_ms = (time.perf_counter() - start) * 1000.0
        if len(ids) > settings.max_prompt_tokens:
            raise InputError(f"the prompt is {len(ids)} tokens; the limit is "
                             f"{settings.max_prompt_tokens}")
        if lm.spec.max_context and len(ids) + settings.max_new_tokens > lm.spec.max_context:
            raise InputError(f"prompt ({len(ids)}) + new tokens ({settings.max_new_tokens}) exceed "
                             f"the model's context of {lm.spec.max_context} tokens")
        layers = settings.attention_layers
        if layers is not None and any(not 0 <= k < lm.spec.layers for k in layers):
            raise InputError(f"attention layers must be between 0 and {lm.spec.layers - 1}")
        if settings.seed is None:
            settings = settings.with_seed(random.randrange(2**31))
        self.recorded_layers = recorded_layers(lm.spec, settings, len(ids))
        self.lm, self.prompt, self.settings = lm, prompt, settings
        self.prompt_ids = ids
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
        self.native: NativeDecoder | None = None
        problem = native_problem or self._static_problem()
        self._decided = problem is not None
        self.decoder = self._torch(problem or "the run has not started")

    def _static_problem(self) -> str | None:
        """Why the native step will not run, as far as can be told before the run starts."""
        s = self.settings
        if s.decoder == "torch":
            return TORCH_ASKED_REASON
        if not s.kv_cache:
            return KV_OFF_REASON
        if self._native_source is None:
            return "no native decoder was given to this run"
        return None

    def _torch(self, reason: str) -> DecoderUsed:
        return DecoderUsed("torch", reason, self.weights, self._torch_bytes)

    def _choose_decoder(self) -> None:
        """Resolve the native decoder (building it if a function was given) and check it fits."""
        if self._decided:
            return
        self._decided = True
        source = self._native_source
        try:
            native = source() if callable(source) and not hasattr(source, "step") else source
        except EngineError as err:
            self.decoder = self._torch(str(err).splitlines()[0] if str(err) else "unavailable")
            return
        need = len(self.prompt_ids) + self.settings.max_new_tokens
        if need > native.max_tokens:
            self.decoder = self._torch(
                f"prompt ({len(self.prompt_ids)}) + new tokens ({self.settings.max_new_tokens}) "
                f"exceed the native cache of {native.max_tokens} tokens")
            return
        self.native = native
        self.decoder = DecoderUsed("native", None, native.weights, int(native.weight_bytes))

    def stop(self) -> None:
        """Ask the run to stop before its next step; what is done stays in the trace."""
        self._stop.set()

    def __iter__(self) -> Iterator[Step]:
        return self._steps()

    def run_all(self) -> Trace:
        for _ in self:
            pass
        return self.trace()

    def _steps(self) -> Iterator[Step]:
        lm, s = self.lm, self.settings
        self._choose_decoder()
        native = self.native
        # The prefill runs on the weights the native step multiplies by (its variant's copy), so
        # the prompt's K/V and first token are those of the model the decode steps continue.
        model, device = (native.model if native is not None else lm.model), lm.device
        generator = None
        if not s.greedy:
            generator = torch.Generator(device=device).manual_seed(s.seed)
        recorder = None
        if self.recorded_layers:
            recorder = AttentionRecorder(layers=frozenset(self.recorded_layers))
        detok = IncrementalDetokenizer(lm.tokenizer)
        eos = eos_token_ids(lm)
        sequence = torch.tensor([self.prompt_ids], device=device)  # (1, S)
        cache = DynamicCache(config=model.config) if s.kv_cache else None
        n_prompt = len(self.prompt_ids)
        for i in range(s.max_new_tokens):
            if self._stop.is_set():
                self.stop_reason = "stopped"
                return
            if recorder is not None:
                recorder.last_query_only = i > 0 and cache is None
            before = MachineSample.now(device)
            self._first = self._first or before
            attention = None
            with torch.inference_mode(), recording(model, recorder):
                if i == 0:
                    logits, hidden = prefill(model, sequence, cache, s.record_hidden)
                elif native is not None:
                    done = native.step(int(sequence[0, -1]), n_prompt + i - 1,
                                       attention_layers=self.recorded_layers,
                                       hidden=s.record_hidden)
                    logits, hidden, attention = done.logits, done.hidden, done.attention
                    if attention is not None:  # (L_rec, H, S) → (L_rec, H, 1, S), as recorded
                        attention = attention[:, :, None].to(torch.float16)
                elif cache is not None:
                    logits, hidden = decode_one_token(model, sequence[:, -1:], cache, s.record_hidden)
                else:
                    logits, hidden = forward_full(model, sequence, s.record_hidden)
                forward = clock_ms(device) - before.wall_ms
                if i == 0 and native is not None:
                    native.load_prefix(cache, n_prompt)  # the prompt's K/V, into the native cache
                token = choose_token(logits, s.temperature, s.top_k, s.top_p, generator)
                probs = torch.softmax(logits.float(), dim=-1)  # (V,) the model's own distribution
                top = torch.topk(probs, s.record_top_k)
                chosen_prob = float(probs[token])
                chosen_rank = int((probs > probs[token]).sum())
                if recorder is not None and attention is None:
                    attention = recorder.take()
                hidden_np = hidden.float().cpu().numpy() if hidden is not None else None
                top_ids = top.indices.cpu().numpy().astype(np.int64)
                top_probs = top.values.cpu().numpy().astype(np.float32)
            after = self._last = MachineSample.now(device)
            latency = after.wall_ms - before.wall_ms
            sequence = torch.cat([sequence, torch.tensor([[token]], device=device)], dim=1)
            if native is not None and i > 0:
                per_layer = native_cache_bytes(lm.spec, n_prompt + i)
            else:
                per_layer = cache_layer_bytes(cache) if cache is not None else (0,) * lm.spec.layers
            if native is not None and i == 0:
                cache = None  # the native cache holds the prompt now; the torch copy can go
            last = token in eos or i == s.max_new_tokens - 1
            text = detok.push(token) + (detok.flush() if last else "")
            step = Step(
                index=i, phase="prefill" if i == 0 else "decode", token_id=token,
                piece=lm.tokenizer.convert_ids_to_tokens(token), text=text,
                position=n_prompt + i, context_len=n_prompt + i, latency_ms=latency,
                kv_bytes=sum(per_layer), kv_bytes_per_layer=per_layer,
                top_ids=top_ids, top_probs=top_probs,
                top_pieces=tuple(lm.tokenizer.convert_ids_to_tokens(top_ids.tolist())),
                chosen_prob=chosen_prob,
                chosen_rank=chosen_rank,
                attention=attention.numpy() if attention is not None else None, hidden=hidden_np,
                forward_ms=forward, cpu_ms=after.cpu_ms - before.cpu_ms,
                others_share=others_share(before, after))
            self.steps.append(step)
            yield step
            if token in eos:
                self.stop_reason = "eos"
                return
        self.stop_reason = "length"

    def trace(self) -> Trace:
        """The trace so far; a run stopped or still going keeps every finished step."""
        tok = self.lm.tokenizer
        special = set(tok.all_special_ids)
        return Trace(
            model=self.lm.spec, settings=self.settings, prompt=self.prompt,
            prompt_token_ids=tuple(self.prompt_ids),
            prompt_pieces=tuple(tok.convert_ids_to_tokens(self.prompt_ids)),
            prompt_special=tuple(i in special for i in self.prompt_ids),
            steps=tuple(self.steps), stop_reason=self.stop_reason,
            tokenize_ms=self.tokenize_ms, device=str(self.lm.device),
            attention_layers=self.recorded_layers, created_at=self.created_at,
            engine_version=__version__, machine=self.machine_load(), decoder=self._used())

    def _used(self) -> DecoderUsed:
        """The decoder record: a finished run whose only step was the prefill decoded nothing
        natively, whatever was chosen."""
        if self.decoder.name == "native" and len(self.steps) <= 1 and self.stop_reason != "running":
            return self._torch("no decode step ran: the run ended with the prefill's token")
        return self.decoder

    def machine_load(self) -> MachineLoad:
        """The machine around the run so far (see engine/timing/disturbance.py for how it is read)."""
        whole = None
        if self._first is not None and self._last is not None:
            whole = others_share(self._first, self._last)
        return MachineLoad(threads=torch.get_num_threads(), cores=usable_cores(),
                           load_before=self._load_before, load_after=load_average(),
                           others_share=whole)


def generate_trace(lm: LoadedModel, prompt: str, settings: GenerationSettings | None = None) -> Trace:
    """Run a whole generation and return its trace (no streaming)."""
    return Run(lm, prompt, settings).run_all()
