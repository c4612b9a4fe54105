"""Every invariant a trace must satisfy before a page, a chart or the model touches it.

A trace file can come from anyone (an upload on a hosted demo), so a file that parses is not yet
a trace: its model spec could claim 10⁹ heads (a page would build a list that size), its token ids
could lie outside the vocabulary (the one-head view would run the model on them), its latencies
could be negative, NaN or 10⁹ ms (a replay would sleep for good). `check_trace` refuses all of
that with one `TraceFormatError` line naming the first broken rule; a trace made by `Run` passes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import TraceFormatError
from ..settings import MAX_NEW_TOKENS_LIMIT
from ..spec import ModelSpec
from .trace import SPECULATION_METHODS, Step, Trace

# Bounds on a spec read from a file: well above any real model (the largest open models have
# ~128 layers, 128 heads, head_dim 256, hidden 16k, a 256k vocabulary), far below sizes a page
# could not draw.
SPEC_LIMITS = {"layers": 1024, "heads": 1024, "kv_heads": 1024, "head_dim": 4096,
               "hidden_size": 1 << 17, "intermediate_size": 1 << 20, "vocab_size": 1 << 22,
               "max_context": 1 << 24}
MAX_PROMPT_TOKENS = 1 << 16
MAX_STEP_MS = 3_600_000.0  # one hour: a slower step is not a measurement this app could show
MIN_STEP_MS = 1e-6  # a step took some time: rates divide by it
VIEW_BYTES = 1 << 30  # one layer's full (heads, S, S) float32 attention, as the Attention page builds
MAX_TILES = 1 << 14  # recorded layers × heads: the model view draws one tile per head
MAX_TEXT_CHARS = 1 << 20
MAX_WEIGHT_BYTES = 1 << 44  # 16 TiB: above any model's weights
MAX_SPECULATION = 64  # draft tokens or n-gram length: far above what pays
MAX_BATCH = 4096  # runs sharing one step: far above what one server batches


def _fail(message: str) -> None:
    raise TraceFormatError(f"not a valid trace: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _in_range(value: Any, low: float, high: float) -> bool:
    """A real number (not a bool, not a 400-digit int that floats cannot hold) in [low, high]."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and low <= value <= high
    except OverflowError:
        return False


def _duration(value: Any, what: str, positive: bool = False) -> None:
    if not _in_range(value, 0.0, MAX_STEP_MS) or (positive and value <= MIN_STEP_MS):
        low = f"{MIN_STEP_MS} ms (excluded)" if positive else "0"
        _fail(f"{what} must be a time between {low} and {MAX_STEP_MS:,.0f} ms, "
              f"got {str(value)[:40]}")


def _token(value: Any, vocab: int, what: str) -> None:
    if not _is_int(value) or not 0 <= value < vocab:
        _fail(f"{what} {value!r} is outside the vocabulary (0..{vocab - 1})")


def check_spec(spec: ModelSpec) -> None:
    for name, limit in SPEC_LIMITS.items():
        value = getattr(spec, name)
        if not _is_int(value) or not 0 <= value <= limit:
            _fail(f"model {name} must be a whole number up to {limit:,}, got {value!r}")
    for name in ("param_count", "weight_bytes"):
        value = getattr(spec, name)
        if not _is_int(value) or value < 0:
            _fail(f"model {name} must be a non-negative whole number")
    if not isinstance(spec.name, str) or len(spec.name) > 1000:
        _fail("the model name must be text of at most 1,000 characters")
    if spec.rope_theta is not None and not (_in_range(spec.rope_theta, 0.0, 1e12)
                                            and spec.rope_theta > 0):
        _fail("rope_theta must be a positive number")


def _check_step(step: Step, i: int, trace: Trace) -> None:
    spec, n = trace.model, len(trace.prompt_token_ids)
    where = f"step {i}"
    if not _is_int(step.index) or step.index != i:
        _fail(f"{where} has index {step.index!r} (steps must be numbered 0, 1, 2, …)")
    if step.phase != ("prefill" if i == 0 else "decode"):
        _fail(f"{where} must be a {'prefill' if i == 0 else 'decode'} step")
    _token(step.token_id, spec.vocab_size, f"{where}: token id")
    if not _is_int(step.position) or not _is_int(step.context_len) \
            or step.position != n + i or step.context_len != n + i:
        _fail(f"{where}: position and context length must be {n + i}")
    _duration(step.latency_ms, f"{where}: latency", positive=True)
    for name in ("forward_ms", "cpu_ms"):
        if getattr(step, name) is not None:
            _duration(getattr(step, name), f"{where}: {name.removesuffix('_ms')} time")
    if step.forward_ms is not None and step.forward_ms > step.latency_ms:
        _fail(f"{where}: the forward cannot take longer than the whole step")
    if not _is_int(step.batch) or not 1 <= step.batch <= MAX_BATCH:
        _fail(f"{where}: the batch size must be a whole number from 1 to {MAX_BATCH}")
    if step.others_share is not None and not _in_range(step.others_share, 0.0, 1.0):
        _fail(f"{where}: the other processes' CPU share must lie between 0 and 1")
    if not isinstance(step.piece, str) or not isinstance(step.text, str) \
            or len(step.piece) > 1000 or len(step.text) > 1000:
        _fail(f"{where}: piece and text must be short strings")
    if len(step.kv_bytes_per_layer) != spec.layers:
        _fail(f"{where}: KV bytes per layer lists {len(step.kv_bytes_per_layer)} layers, "
              f"the model has {spec.layers}")
    if any(not _is_int(b) or b < 0 for b in step.kv_bytes_per_layer) \
            or step.kv_bytes != sum(step.kv_bytes_per_layer):
        _fail(f"{where}: KV bytes must be non-negative and add up over the layers")
    k = len(step.top_ids)
    if step.top_ids.shape != (k,) or step.top_probs.shape != (k,) or not 1 <= k <= 100:
        _fail(f"{where}: top-k arrays must be two 1-D arrays of 1 to 100 entries")
    if k and (step.top_ids.min() < 0 or step.top_ids.max() >= spec.vocab_size):
        _fail(f"{where}: a top-k id is outside the vocabulary")
    if not (np.isfinite(step.top_probs).all() and (step.top_probs >= 0).all()
            and (step.top_probs <= 1).all()):
        _fail(f"{where}: top-k probabilities must lie between 0 and 1")
    if any(not isinstance(p, str) or len(p) > 1000 for p in step.top_pieces):
        _fail(f"{where}: top-k pieces must be short strings")
    if not _in_range(step.chosen_prob, 0.0, 1.0):
        _fail(f"{where}: the chosen token's probability must lie between 0 and 1")
    if not _is_int(step.chosen_rank) or not 0 <= step.chosen_rank < spec.vocab_size:
        _fail(f"{where}: the chosen token's rank must be between 0 and {spec.vocab_size - 1}")
    if step.attention is not None:
        expected = (len(trace.attention_layers), spec.heads, n if i == 0 else 1, step.context_len)
        if step.attention.shape != expected:
            _fail(f"{where}: attention has shape {step.attention.shape}, expected {expected} "
                  "(recorded layers, heads, query rows, context)")
        if not np.isfinite(step.attention).all():
            _fail(f"{where}: attention weights must be finite")
    if step.hidden is not None and step.hidden.shape != (spec.layers + 1, spec.hidden_size):
        _fail(f"{where}: hidden states have shape {step.hidden.shape}, expected "
              f"{(spec.layers + 1, spec.hidden_size)}")


def _check_machine(trace: Trace) -> None:
    machine = trace.machine
    if machine is None:
        return
    for name in ("threads", "cores"):
        value = getattr(machine, name)
        if not _is_int(value) or not 1 <= value <= 4096:
            _fail(f"the machine's {name} must be a whole number from 1 to 4,096")
    for name in ("load_before", "load_after"):
        value = getattr(machine, name)
        if value is not None and not _in_range(value, 0.0, 1e6):
            _fail("the machine's load average must be a non-negative number")
    if machine.others_share is not None and not _in_range(machine.others_share, 0.0, 1.0):
        _fail("the other processes' CPU share must lie between 0 and 1")


def _check_decoder(trace: Trace) -> None:
    used = trace.decoder
    if used is None:
        return
    if used.reason is not None and (not isinstance(used.reason, str) or len(used.reason) > 500):
        _fail("the decoder's reason must be a line of text of at most 500 characters")
    if not isinstance(used.weights, str) or not 1 <= len(used.weights) <= 40:
        _fail("the weights variant must be a short name")
    if not _is_int(used.weight_bytes) or not 0 <= used.weight_bytes <= MAX_WEIGHT_BYTES:
        _fail(f"the decoder's weight bytes must be a whole number from 0 to {MAX_WEIGHT_BYTES:,}")


def _check_speculation(trace: Trace) -> None:
    """A speculative run's record must add up to its steps: the prefill's token, then each
    verify step's tokens (accepted drafts + the model's own, bare accepted drafts only on a last
    step that accepted end-of-sequence), each token after the first of its forward carrying no
    forward time of its own (docs/trace-format.md)."""
    spec = trace.speculation
    if spec is None:
        return
    if spec.method not in SPECULATION_METHODS:
        _fail(f"unknown speculation method {str(spec.method)[:40]!r}")
    for name in ("draft_tokens", "ngram"):
        if not _is_int(getattr(spec, name)) or not 1 <= getattr(spec, name) <= MAX_SPECULATION:
            _fail(f"the speculation's {name} must be a whole number from 1 to {MAX_SPECULATION}")
    lists = (spec.step_proposed, spec.step_accepted, spec.step_tokens, spec.step_ms)
    if len({len(values) for values in lists}) != 1:
        _fail("the speculation's per-step lists differ in length")
    last = spec.verify_steps - 1
    for j, (proposed, accepted, tokens, ms) in enumerate(zip(*lists)):
        where = f"verify step {j}"
        if not all(_is_int(v) for v in (proposed, accepted, tokens)) \
                or not 0 <= accepted <= proposed <= spec.draft_tokens:
            _fail(f"{where}: accepted ≤ proposed ≤ {spec.draft_tokens} drafts, whole numbers")
        if tokens != accepted + 1 and not (j == last and tokens == accepted >= 1):
            _fail(f"{where}: it must emit its accepted drafts and one token of its own")
        _duration(ms, f"{where}: time", positive=True)
    if trace.steps and len(trace.steps) != 1 + sum(spec.step_tokens) \
            or not trace.steps and spec.verify_steps:
        _fail("the speculation's tokens (the prefill's and each verify step's) must add up to "
              "the steps")
    if not trace.settings.greedy or not trace.settings.kv_cache:
        _fail("speculative decoding is recorded for greedy runs with the KV cache on only")
    for step, first in zip(trace.steps, spec.first_of_step(len(trace.steps))):
        if step.attention is not None or step.hidden is not None:
            _fail("a speculative run records no attention or hidden states")
        if not first and step.forward_ms != 0:
            _fail(f"step {step.index} arrived with its verify step's first token: its own "
                  "forward time must be 0")


def _check_branch(trace: Trace) -> None:
    """A branch keeps its parent's tokens before the branch point and has the chosen token at
    it, which the parent did not choose there (docs/trace-format.md)."""
    b = trace.branch
    if b is None:
        return
    out = trace.output_token_ids
    if not _is_int(b.at) or not 0 <= b.at < min(len(out), len(b.parent_tokens)):
        _fail("the branch point must be a step of both the branch and its parent")
    for token in b.parent_tokens:
        _token(token, trace.model.vocab_size, "the branch's parent token id")
    if out[b.at] != b.token or b.parent_tokens[b.at] == b.token:
        _fail("the branch's token must be its step at the branch point, and not the parent's")
    if tuple(out[:b.at]) != tuple(b.parent_tokens[:b.at]):
        _fail("a branch's tokens before the branch point must be its parent's")
    limit = len(trace.prompt_token_ids) + len(out)
    if not all(_is_int(n) and 0 <= n <= limit for n in (b.reused_tokens, b.computed_tokens)):
        _fail(f"the branch's reused and computed tokens must be whole numbers from 0 to {limit}")
    _duration(b.branch_ms, "the branch's time")
    if b.rerun_ms is not None:  # None: the budget stopped the re-run
        _duration(b.rerun_ms, "the branch's re-run time")
    if not isinstance(b.same_as_rerun, bool) or (b.rerun_ms is None and b.same_as_rerun):
        _fail("the branch's same-as-rerun flag must be true or false")


def check_trace(trace: Trace) -> Trace:
    """Raise TraceFormatError at the first broken invariant; return the trace if all hold."""
    spec = trace.model
    check_spec(spec)
    n = len(trace.prompt_token_ids)
    if not 1 <= n <= MAX_PROMPT_TOKENS:
        _fail(f"the prompt must have 1 to {MAX_PROMPT_TOKENS:,} tokens, it has {n:,}")
    if len(trace.prompt_pieces) != n or len(trace.prompt_special) != n:
        _fail("prompt ids, pieces and special-token flags differ in length")
    for token_id in trace.prompt_token_ids:
        _token(token_id, spec.vocab_size, "prompt token id")
    if any(not isinstance(p, str) or len(p) > 1000 for p in trace.prompt_pieces):
        _fail("prompt pieces must be short strings")
    if len(trace.prompt) > MAX_TEXT_CHARS:
        _fail(f"the prompt text is over {MAX_TEXT_CHARS:,} characters")
    if any(len(text) > 100 for text in (trace.device, trace.created_at, trace.engine_version)):
        _fail("device, creation time and engine version must be short strings")
    layers = trace.attention_layers
    if list(layers) != sorted(set(layers)) or any(not _is_int(k) or not 0 <= k < spec.layers
                                                   for k in layers):
        _fail(f"recorded attention layers must be distinct, sorted and between 0 and "
              f"{spec.layers - 1}")
    if len(trace.steps) > MAX_NEW_TOKENS_LIMIT:
        _fail(f"a trace has at most {MAX_NEW_TOKENS_LIMIT} steps")
    _duration(trace.tokenize_ms, "tokenization time")
    _check_machine(trace)
    _check_decoder(trace)
    for i, step in enumerate(trace.steps):
        _check_step(step, i, trace)
    for name in ("attention", "hidden"):
        if len({getattr(step, name) is None for step in trace.steps}) > 1:
            _fail(f"{name} must be recorded on every step or on none")
    _check_speculation(trace)
    _check_branch(trace)
    return trace


def check_viewable(trace: Trace, max_tokens: int) -> Trace:
    """The views' own budget, on top of `check_trace`: at most `max_tokens` positions (prompt +
    output), one layer's (heads, S, S) attention within VIEW_BYTES, and a model view of at most
    MAX_TILES heads — so a small file cannot ask a page for gigabytes or a million tiles."""
    tokens = len(trace.prompt_token_ids) + len(trace.steps)
    if tokens > max_tokens:
        _fail(f"it has {tokens:,} tokens (prompt and output); this app shows traces of up to "
              f"{max_tokens:,}")
    if trace.model.heads * tokens * tokens * 4 > VIEW_BYTES:
        _fail(f"{trace.model.heads:,} heads over {tokens:,} tokens are too large to view here")
    if len(trace.attention_layers) * trace.model.heads > MAX_TILES:
        _fail(f"{len(trace.attention_layers)} recorded layers × {trace.model.heads} heads are too "
              "many to view here")
    return trace
