"""Two traces side by side: where their tokens first differ, their latency and memory numbers,
which settings differ, and whether the same attention layer and head can be read from both.

Pure functions of two Traces (no Streamlit, no model): the Compare page draws what they return,
and a re-run "with one change" is built here too (`one_change`), so that what differs between
run A and run B is exactly what the page says it changed.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Callable, Literal

import numpy as np

from i18n import N_, _

from ..records.trace import Trace
from ..settings import GenerationSettings
from ..timing.metrics import LatencySummary, summarize
from .attention_stats import has_attention
from .weights_notice import run_weights

Change = Literal["kv_cache", "chat_template", "dtype", "prompt"]
CHANGES: dict[Change, str] = {  # what "run again with one change" offers, as the page names it
    "kv_cache": "KV cache on ↔ off",
    "chat_template": "chat template on ↔ off",
    "dtype": "weights float32 ↔ float16",
    "prompt": "another prompt",
}
DTYPE_SWAP = {"float32": "float16", "float16": "float32"}


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where the sequences differ — a different token, or one sequence ended
    while the other goes on — or None when they are identical."""
    shorter = min(len(a), len(b))
    unequal = np.flatnonzero(np.asarray(a[:shorter], dtype=np.int64)
                             != np.asarray(b[:shorter], dtype=np.int64))
    if len(unequal):
        return int(unequal[0])
    return None if len(a) == len(b) else shorter


@dataclass(frozen=True, slots=True)
class TokenDiff:
    """Prompt and answer token ids of two runs compared position by position."""

    prompt: int | None  # first differing prompt position (None: the same prompt tokens)
    answer: int | None  # first differing answer position (None: the same answer tokens)
    prompt_lengths: tuple[int, int]
    answer_lengths: tuple[int, int]

    @property
    def identical(self) -> bool:
        return self.prompt is None and self.answer is None


def token_diff(a: Trace, b: Trace) -> TokenDiff:
    return TokenDiff(first_difference(a.prompt_token_ids, b.prompt_token_ids),
                     first_difference(a.output_token_ids, b.output_token_ids),
                     (len(a.prompt_token_ids), len(b.prompt_token_ids)),
                     (len(a.steps), len(b.steps)))


@dataclass(frozen=True, slots=True)
class MetricRow:
    """One number of both runs; `formula` says how it is computed from a trace."""

    name: str
    unit: Literal["ms", "tok/s", "B", "tokens"]
    a: float | None
    b: float | None
    formula: str

    @property
    def difference(self) -> float | None:
        """B − A (None when either run lacks the number)."""
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def ratio(self) -> float | None:
        """B ÷ A (None when either lacks it or A is 0)."""
        return None if self.a is None or self.b is None or self.a == 0 else self.b / self.a


_METRICS: tuple[tuple[str, str, Callable[[LatencySummary, Trace], float | None], str], ...] = (
    ("TTFT", "ms", lambda s, t: s.ttft_ms, "tokenization + prefill step"),
    ("median ITL", "ms", lambda s, t: s.itl_p50_ms, "50th percentile of the decode steps' latency"),
    ("decode rate", "tok/s", lambda s, t: s.decode_tokens_per_s,
     "decode steps ÷ their summed latency"),
    ("end to end", "ms", lambda s, t: s.e2e_ms, "tokenization + every step's latency"),
    ("KV cache at the end", "B", lambda s, t: float(t.kv_bytes) if t.steps else None,
     "measured nbytes of the cache's key and value tensors after the last step"),
    ("prompt tokens", "tokens", lambda s, t: float(s.prompt_tokens), "tokens fed to the prefill"),
    ("answer tokens", "tokens", lambda s, t: float(s.output_tokens), "tokens generated"),
)


def metric_rows(a: Trace, b: Trace) -> tuple[MetricRow, ...]:
    """TTFT, median ITL, decode rate, end-to-end time, final KV bytes and token counts of both
    runs, each from `engine.timing.metrics.summarize` (or the trace's measured KV bytes)."""
    sa, sb = summarize(a), summarize(b)
    return tuple(MetricRow(name, unit, get(sa, a), get(sb, b), formula)  # type: ignore[arg-type]
                 for name, unit, get, formula in _METRICS)


@dataclass(frozen=True, slots=True)
class SettingRow:
    name: str
    a: str
    b: str

    @property
    def differs(self) -> bool:
        return self.a != self.b


def _seed(settings: GenerationSettings) -> str:
    return "– (greedy: unused)" if settings.greedy else str(settings.seed)


def _layers(trace: Trace) -> str:
    if not has_attention(trace):
        return _("none")
    if len(trace.attention_layers) == trace.model.layers:
        return _("all {layers}").format(layers=trace.model.layers)
    return ", ".join(map(str, trace.attention_layers))


_SETTINGS: tuple[tuple[str, Callable[[Trace], object]], ...] = (
    ("model", lambda t: t.model.name),
    ("weights", lambda t: run_weights(t) if t.decoder is not None else t.model.dtype),
    ("decode steps by", lambda t: t.decoder.label if t.decoder is not None else "not recorded"),
    ("device", lambda t: t.device),
    ("prompt", lambda t: t.prompt),
    ("chat template", lambda t: "on" if t.settings.chat_template else "off"),
    ("KV cache", lambda t: "on" if t.settings.kv_cache else "off"),
    ("temperature", lambda t: "0 (greedy)" if t.settings.greedy else f"{t.settings.temperature:g}"),
    ("top-k", lambda t: "off" if t.settings.top_k == 0 else str(t.settings.top_k)),
    ("top-p", lambda t: "off" if t.settings.top_p == 1 else f"{t.settings.top_p:g}"),
    ("seed", lambda t: _seed(t.settings)),
    ("max new tokens", lambda t: str(t.settings.max_new_tokens)),
    ("attention layers recorded", _layers),
    ("ended because", lambda t: t.stop_reason),
)


def setting_rows(a: Trace, b: Trace) -> tuple[SettingRow, ...]:
    """What each run was asked to do (and on what), as text; `differs` marks the rows to see."""
    return tuple(SettingRow(name, str(get(a)), str(get(b))) for name, get in _SETTINGS)


@dataclass(frozen=True, slots=True)
class AttentionPair:
    """Which layers and heads both traces recorded; `note` says why none, or what to keep in
    mind (different models, different prompt lengths)."""

    layers: tuple[int, ...]  # recorded in both
    heads: int  # query heads both models have
    note: str | None
    same_model: bool

    @property
    def available(self) -> bool:
        return bool(self.layers) and self.heads > 0


def attention_pair(a: Trace, b: Trace) -> AttentionPair:
    same_model = (a.model.name, a.model.layers, a.model.heads) == (b.model.name, b.model.layers,
                                                                    b.model.heads)
    missing = tuple(name for name, t in (("A", a), ("B", b)) if not has_attention(t))
    if missing:
        which = {("A",): N_("run A"), ("B",): N_("run B")}.get(missing, N_("run A and run B"))
        return AttentionPair((), 0, _("No attention to compare: {which} recorded none (the "
                                      "“Record attention” setting was off).").format(
            which=_(which)), same_model)
    layers = tuple(sorted(set(a.attention_layers) & set(b.attention_layers)))
    heads = min(a.model.heads, b.model.heads)
    if not layers:
        return AttentionPair((), heads, _("No layer was recorded in both runs (A: {a}; B: {b}).")
                             .format(a=_layers(a), b=_layers(b)), same_model)
    if not same_model:
        note = _("Different models ({a} vs {b}): the same layer and head number are different "
                 "weights.").format(a=a.model.name, b=b.model.name)
    elif a.prompt_token_ids != b.prompt_token_ids:
        note = _("Different prompt tokens ({a} vs {b}): each map has its own rows and "
                 "columns.").format(a=len(a.prompt_token_ids), b=len(b.prompt_token_ids))
    else:
        note = None
    return AttentionPair(layers, heads, note, same_model)


def largest_difference(wa: np.ndarray, wb: np.ndarray) -> float | None:
    """max |B − A| over the cells both matrices hold (NaN, the causal mask, ignored); None when
    their shapes differ, so there is no cell-by-cell comparison."""
    if wa.shape != wb.shape:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-masked matrix
        value = np.nanmax(np.abs(wb.astype(np.float64) - wa.astype(np.float64)))
    return float(value) if np.isfinite(value) else None


def same_input_rows(a: Trace, b: Trace) -> int:
    """How many leading positions were fed the same tokens in both runs (prompt, then each
    generated token but the last, which was never fed back): only those attention rows can be
    compared cell by cell — after the runs part, different tokens make different maps."""
    fed_a = list(a.prompt_token_ids) + list(a.output_token_ids[:-1])
    fed_b = list(b.prompt_token_ids) + list(b.output_token_ids[:-1])
    first = first_difference(fed_a, fed_b)
    return min(len(fed_a), len(fed_b)) if first is None else first


def one_change(settings: GenerationSettings, change: Change) -> GenerationSettings:
    """Run A's settings with one setting flipped (the KV cache or the chat template); a dtype or
    prompt change leaves the settings as they are (the model or the prompt changes instead)."""
    if change == "kv_cache":
        return replace(settings, kv_cache=not settings.kv_cache)
    if change == "chat_template":
        return replace(settings, chat_template=not settings.chat_template)
    if change in ("dtype", "prompt"):
        return settings
    raise ValueError(f"unknown change {change!r}")


MAX_TEMPERATURE = 2.0  # the sidebar's ranges (app.py)
MAX_TOP_K = 1000


def decoder_note(a: Trace, b: Trace) -> str | None:
    """A warning when the two runs' decode steps ran on different decoders (or weights): their
    ITL then differs by the kernel too, not only by what the user changed. None when the same
    (or not recorded in both)."""
    da, db = a.decoder, b.decoder
    if da is None or db is None:
        return None
    wa, wb = run_weights(a), run_weights(b)  # a GGUF file's blocks are not fp32's
    if (da.name, wa) == (db.name, wb):
        return None
    return _("Run A's decode steps ran on the {label_a} ({weights_a} weights) and run B's on the "
             "{label_b} ({weights_b} weights): their step times differ by the decoder too, not "
             "only by the change.").format(label_a=da.label, weights_a=wa,
                                           label_b=db.label, weights_b=wb)


def rerun_settings(trace: Trace, change: Change, max_new_tokens: int, max_prompt_tokens: int
                   ) -> GenerationSettings:
    """What a re-run of `trace` with one change asks for: the trace's own settings (its recorded
    seed; its recorded attention layers, so the same layer exists in both — except for another
    prompt, whose length the attention budget must choose layers for), the change, and this
    app's limits on tokens; run A's decoder (the native step where A used it and it can run
    with the change — KV cache off always decodes in torch, and the page says so)."""
    recorded = has_attention(trace)
    own = trace.settings  # may come from an uploaded file: only what a sidebar could set is kept
    sampled = own.temperature > 0
    chosen = GenerationSettings(
        max_new_tokens=min(own.max_new_tokens, max_new_tokens),
        temperature=min(own.temperature, MAX_TEMPERATURE),
        top_k=min(own.top_k, MAX_TOP_K) if sampled else 0,
        top_p=own.top_p if sampled else 1.0,
        seed=own.seed, chat_template=own.chat_template, kv_cache=own.kv_cache,
        record_attention=recorded, max_prompt_tokens=max_prompt_tokens,
        # the decoder that made run A: its speed is not part of the one change (a format 1–3
        # trace names no decoder: torch decoded it)
        decoder="native" if trace.decoder is not None and trace.decoder.name == "native"
        else "torch")
    layers = trace.attention_layers if recorded and change != "prompt" else None
    if layers is not None and len(layers) > 0:
        # the recorded layers only while they fit the default attention budget at this length;
        # else the budget chooses (as for a run of the sidebar's own)
        spec, tokens = trace.model, len(trace.prompt_token_ids)
        per_layer = spec.heads * tokens * tokens * 2  # float16 prefill weights (as runner.py)
        if per_layer * len(layers) > chosen.attention_budget_mb << 20:
            layers = None
    return replace(one_change(chosen, change), attention_layers=layers)
