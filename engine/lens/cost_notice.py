""""What to notice" about what a run cost: prefill vs decode (time, weight bytes a decode step
read) and the KV cache (formula against the measured bytes) — the last two stages of the story
(engine/lens/notice.py has the others). A model opened from a GGUF file reads its own blocks:
its bytes per parameter are the file's, not its float dtype's (`ModelSpec.stored_bits`)."""

from __future__ import annotations

from dataclasses import dataclass

from i18n import _

from ..records.trace import Trace
from ..spec import ModelSpec
from ..timing.metrics import forward_median_ms, summarize
from ..timing.roofline import native_weight_bytes
from .notice import sentences
from .wording import size

# ---------------------------------------------------------------- prefill vs decode

def weights_read(spec: ModelSpec) -> int:
    """Weight bytes one forward reads: parameters × bytes per parameter (a GGUF file's: its
    stored bytes ÷ its parameters); an untied input embedding is only looked up (one row per
    token), so all but one of its rows are left out."""
    params = spec.param_count
    if not spec.tie_word_embeddings:
        params -= (spec.vocab_size - 1) * spec.hidden_size
    if spec.stored_bits is not None:
        return params * spec.weight_bytes // spec.param_count
    return params * spec.dtype_bytes


@dataclass(frozen=True, slots=True)
class PhaseNotice:
    prompt_tokens: int
    ttft_ms: float
    prefill_ms_per_token: float  # 1000 / summarize().prefill_tokens_per_s
    decode_steps: int
    itl_median_ms: float | None  # summarize().itl_p50_ms
    step: int  # the middle decode step
    params: int
    dtype_bytes: int
    tied: bool
    weight_bytes: int  # weights_read, or the native step's packed weights
    kv_read: int  # KV bytes that step read: bytes per token · its context
    packed: str | None = None  # "q4_0": the decode steps read the native step's packed weights
    speculative: bool = False  # decode ran as verify forwards: times are per forward, not token
    stored_bits: float | None = None  # a GGUF file's blocks: their mean bits per weight

    @property
    def text(self) -> str:
        head = _("Prefill read all {tokens} prompt tokens in one pass: TTFT {ttft:.1f} ms.").format(
            tokens=self.prompt_tokens, ttft=self.ttft_ms)
        if not self.decode_steps or self.itl_median_ms is None:
            return sentences(head, _("This run stopped after its first token, so there was no "
                                     "decode step."))
        per_prompt_token = self.prefill_ms_per_token
        formula = (_("{params:,} parameters × {bytes} B").format(params=self.params,
                                                                 bytes=self.dtype_bytes)
                   if self.tied else
                   _("(parameters − the input embedding's unread rows) × {bytes} B").format(
                       bytes=self.dtype_bytes))
        if self.stored_bits is not None:
            formula = (_("the GGUF file's own blocks, measured") if self.packed is not None else
                       _("the GGUF file's own blocks, {bits:.3g} bits per weight").format(
                           bits=self.stored_bits))
        elif self.packed is not None:
            formula = _("the native step's packed {format} weights, measured").format(
                format=self.packed)
        if self.speculative:
            decode = _("Decode then took a median of {itl:.1f} ms per verify forward (speculative "
                       "decoding: each emitted one or more tokens) — {ratio:.1f}× the prefill's "
                       "{prefill:.2f} ms per prompt token (the prefill step alone, without "
                       "tokenizing).")
        else:
            decode = _("Decode then took a median of {itl:.1f} ms per token (ITL) — {ratio:.1f}× "
                       "the prefill's {prefill:.2f} ms per prompt token (the prefill step alone, "
                       "without tokenizing).")
        decode = decode.format(itl=self.itl_median_ms, ratio=self.itl_median_ms / per_prompt_token,
                               prefill=per_prompt_token)
        step = _("Decode step {step} read {weights} of weights ({formula}) and {kv} of KV cache to "
                 "produce one token: decode waits on memory, not arithmetic.").format(
            step=self.step, weights=size(self.weight_bytes), formula=formula, kv=size(self.kv_read))
        return sentences(head, decode, step)


def phase_notice(trace: Trace) -> PhaseNotice:
    spec = trace.model
    decode = trace.decode_forwards  # a speculative run: its verify forwards, not every token
    middle = decode[len(decode) // 2] if decode else None
    metrics = summarize(trace)
    itl = metrics.itl_p50_ms if trace.speculation is None else forward_median_ms(trace)
    kv_read = spec.kv_bytes_per_token * middle.context_len if middle and trace.settings.kv_cache else 0
    rate = metrics.prefill_tokens_per_s
    return PhaseNotice(len(trace.prompt_token_ids), trace.ttft_ms or 0.0,
                       1000 / rate if rate else 0.0, len(decode),
                       itl, middle.index if middle else -1,
                       spec.param_count, spec.dtype_bytes, spec.tie_word_embeddings,
                       native_weight_bytes(trace) or weights_read(spec), kv_read,
                       trace.decoder.weights if native_weight_bytes(trace) else None,
                       trace.speculation is not None, spec.stored_bits)


# ---------------------------------------------------------------- the KV cache

@dataclass(frozen=True, slots=True)
class KVNotice:
    cache_on: bool
    tokens: int  # positions cached after the last step
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    formula_bytes: int
    measured_bytes: int
    max_context: int

    @property
    def per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def text(self) -> str:
        if not self.cache_on:
            return _("This run had the KV cache off: nothing was kept, and every step recomputed "
                     "the keys and values of the whole sequence. Switch it on to watch it grow.")
        if self.measured_bytes == self.formula_bytes:
            held = _("After the last step the cache holds keys and values for {tokens} positions: "
                     "2 · {layers} layers · {kv_heads} KV heads · {head_dim} head_dim · {bytes} B · "
                     "{tokens} tokens = {formula:,} B ({size}), the same as the tensors' measured "
                     "nbytes.")
        else:
            held = _("After the last step the cache holds keys and values for {tokens} positions: "
                     "2 · {layers} layers · {kv_heads} KV heads · {head_dim} head_dim · {bytes} B · "
                     "{tokens} tokens = {formula:,} B ({size}), measured in the tensors: "
                     "{measured:,} B.")
        parts = [held.format(tokens=self.tokens, layers=self.layers, kv_heads=self.kv_heads,
                             head_dim=self.head_dim, bytes=self.dtype_bytes,
                             formula=self.formula_bytes, size=size(self.formula_bytes),
                             measured=self.measured_bytes),
                 _("Every new token adds {bytes:,} B.").format(bytes=self.per_token)]
        if self.max_context:
            parts.append(_("At the model's {limit:,}-token limit it would take {size}.").format(
                limit=self.max_context, size=size(self.per_token * self.max_context)))
        return sentences(*parts)


def kv_notice(trace: Trace) -> KVNotice:
    spec = trace.model
    tokens = trace.steps[-1].context_len if trace.steps else 0
    return KVNotice(trace.settings.kv_cache, tokens, spec.layers, spec.kv_heads, spec.head_dim,
                    spec.dtype_bytes, spec.kv_bytes(tokens), trace.kv_bytes, spec.max_context)
