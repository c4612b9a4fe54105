""""What to notice" about weights in fewer bits: the bytes of weights one decode step of the
trace's model reads in fp32 / fp16 / int8 / Q4_0, and which of them this run read — the story's
stage after the KV cache (engine/lens/notice.py and cost_notice.py have the others).

Every decode step reads every weight once, and decode waits on memory, so the bytes a step reads
bound how fast it can go. They are computed from the trace's model spec with the quantization
calculator's formulas (engine/quant/calculator.py: params × bits / 8, the bits including each
format's scales), over the parts the variants quantize (engine/quant/variants.py SCOPE):
- float formats: every weight a step reads × 32 or 16 / 8;
- integer formats: the decoder layers' weights (parameters − embedding tables − norms) in the
  format, the embedding / LM head in Q8_0 (8 + 16/32 = 8.5 bits), the norms in float32.
An untied input embedding is only looked up, one row per token, so its other rows are left out
(as cost_notice.weights_read does). When the trace records the native decoder, its
measured bytes (the packed buffer it streamed) and the median ITL it achieved are used.

A model opened from a GGUF file runs on the file's own blocks: its trace names the weights as
loaded ("fp32": no variant was made) but its spec stores fewer bytes than float32's
(`ModelSpec.stored_bits`). Its run then reads `GGUF` — the file's mean bits per weight over the
weights a step reads — and the line compares it with fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from i18n import N_, _

from ..quant.calculator import format_bits, stored_bytes
from ..quant.scheme import FORMATS
from ..records.trace import Trace
from ..settings import FLOAT_WEIGHTS
from ..spec import ModelSpec
from ..timing.metrics import forward_median_ms, summarize
from .notice import sentences
from .wording import size

STORY_FORMATS = ("fp32", "fp16", "int8", "q4_0")  # the explainer's four (4-bit as Q4_0)
EMBEDDING_FORMAT = "q8_0"  # the integer variants' embedding / LM head (engine/quant/variants.py)
NORM_BYTES = 4  # the norms stay float32 in every integer variant
AWQ_PREFIX = "awq_"  # awq_<format> stores its base format (engine/quant/variants.py)
GGUF = "GGUF"  # a GGUF file's own blocks, as stored (no variant name of its own)


def label(name: str) -> str:
    """How the story writes a format: fp32, fp16, int8, Q4_0, AWQ Q3."""
    base = name.removeprefix(AWQ_PREFIX)
    shown = base.upper() if base.startswith("q") else base  # Q4_0, Q4_K_M
    return f"AWQ {shown}" if name.startswith(AWQ_PREFIX) else shown


def bits_label(spec: ModelSpec, name: str) -> str:
    """A format and its stored bits per layer weight, scales included: "Q4_0 · 4.5 bits"."""
    if name == GGUF and spec.stored_bits is not None:
        return _("{format} · {bits:.3g} bits").format(format=label(name), bits=spec.stored_bits)
    try:
        bits = format_bits(name.removeprefix(AWQ_PREFIX), spec.hidden_size)
    except ValueError:
        return label(name)
    return _("{format} · {bits:.3g} bits").format(format=label(name), bits=bits)


@dataclass(frozen=True, slots=True)
class Parts:
    """What one decode step reads, in parameters, split the way the variants store it."""

    layers: int  # decoder-layer weights: parameters − embedding tables − norms
    embedding: int  # embedding / LM head rows read: vocab · hidden (+ one input row if untied)
    norms: int  # hidden · (2 · layers + 1): two RMSNorms per layer and the final one

    @property
    def total(self) -> int:
        return self.layers + self.embedding + self.norms


def step_parts(spec: ModelSpec) -> Parts:
    tables = 1 if spec.tie_word_embeddings else 2
    norms = spec.hidden_size * (2 * spec.layers + 1)
    layers = spec.param_count - tables * spec.vocab_size * spec.hidden_size - norms
    embedding = spec.vocab_size * spec.hidden_size + (0 if spec.tie_word_embeddings else spec.hidden_size)
    return Parts(layers, embedding, norms)


def step_bytes(spec: ModelSpec, name: str) -> float:
    """Weight bytes one decode step of `spec`'s model reads stored as variant `name`
    (ValueError for a name the calculator does not know)."""
    parts = step_parts(spec)
    base = name.removeprefix(AWQ_PREFIX)
    if base == GGUF and spec.stored_bits is not None:  # the file's blocks, at their mean bits
        return parts.total * spec.stored_bits / 8
    if base not in FORMATS:  # fp32 / fp16 / bf16
        return stored_bytes(parts.total, base)
    return (stored_bytes(parts.layers, base, spec.hidden_size)
            + stored_bytes(parts.embedding, EMBEDDING_FORMAT) + parts.norms * NORM_BYTES)


def formula(spec: ModelSpec) -> str:
    """The formula of step_bytes with this model's numbers, for the figure's caption."""
    parts = step_parts(spec)
    return _("fp32 / fp16: all {total:,} weights a step reads × 32 or 16 bits / 8. "
             "int8 and Q4_0: the layers' {layers:,} weights × their bits / 8 — int8 "
             "{int8_bits:.2f} bits (8 + one float16 scale per row of {hidden}), Q4_0 {q4_bits:g} "
             "bits (4 + one float16 scale per 32) — + the embedding / LM head's {embedding:,} × "
             "{embedding_bits:g} / 8 (Q8_0) + the norms' {norms:,} × {norm_bytes} B "
             "(float32)").format(
        total=parts.total, layers=parts.layers, int8_bits=format_bits("int8", spec.hidden_size),
        hidden=spec.hidden_size, q4_bits=format_bits("q4_0"), embedding=parts.embedding,
        embedding_bits=format_bits(EMBEDDING_FORMAT), norms=parts.norms, norm_bytes=NORM_BYTES)


# WeightsNotice's first sentence: (what the bytes come from, the other format reads less) → it
_READ_LINES = {
    ("measured", True): N_(
        "The native C step ran this run's decode on {own} weights: each step read {read} of them "
        "(measured: the buffer it streams; the formula gives {formula}); stored as {other} the "
        "same step would read {other_read}, {ratio:.1f}× less."),
    ("measured", False): N_(
        "The native C step ran this run's decode on {own} weights: each step read {read} of them "
        "(measured: the buffer it streams; the formula gives {formula}); stored as {other} the "
        "same step would read {other_read}, {ratio:.1f}× more."),
    ("float_copy", True): N_(
        "This run's weights were rounded to {own}, but torch eager multiplied by a float32 copy of "
        "those values: each decode step read {read} (the native C step reads the {own} codes "
        "themselves, {formula}); stored as {other} the same step would read {other_read}, "
        "{ratio:.1f}× less."),
    ("float_copy", False): N_(
        "This run's weights were rounded to {own}, but torch eager multiplied by a float32 copy of "
        "those values: each decode step read {read} (the native C step reads the {own} codes "
        "themselves, {formula}); stored as {other} the same step would read {other_read}, "
        "{ratio:.1f}× more."),
    ("formula", True): N_(
        "Each decode step of this run read {read} of weights ({own}); stored as {other} the same "
        "step would read {other_read}, {ratio:.1f}× less."),
    ("formula", False): N_(
        "Each decode step of this run read {read} of weights ({own}); stored as {other} the same "
        "step would read {other_read}, {ratio:.1f}× more."),
}


@dataclass(frozen=True, slots=True)
class WeightsNotice:
    weights: str  # the run's variant: trace.decoder.weights, or the spec's dtype for older traces
    formats: tuple[str, ...]  # STORY_FORMATS, plus the run's own when it is another one
    formula_bytes: tuple[float, ...]  # step_bytes of each format (0 for a name it cannot count)
    decoder: str | None  # "native", "torch", or None for traces from before the record
    measured_bytes: int | None  # the native decoder's buffer, when it ran
    itl_median_ms: float | None
    decode_steps: int

    def bytes_of(self, name: str) -> float:
        return self.formula_bytes[self.formats.index(name)] if name in self.formats else 0.0

    @property
    def float_copy(self) -> bool:
        """Torch eager ran an integer variant: its steps multiplied by a float32 copy of the
        rounded values (engine/quant/variants.py), so they read fp32's bytes, not the codes."""
        return self.decoder == "torch" and self.weights.removeprefix(AWQ_PREFIX) in FORMATS

    @property
    def read_bytes(self) -> float:
        """What a decode step of this run read: measured when the native step ran, else the formula."""
        if self.measured_bytes is not None:
            return float(self.measured_bytes)
        return self.bytes_of("fp32" if self.float_copy else self.weights)

    @property
    def other(self) -> str:
        """The format the line compares with: Q4_0 for a run that read float weights, fp32 for
        one whose native step read the codes of an integer format, or a GGUF file's blocks."""
        integer = self.weights.removeprefix(AWQ_PREFIX) in FORMATS
        return "fp32" if (integer and not self.float_copy) or self.weights == GGUF else "q4_0"

    @property
    def text(self) -> str:
        if not self.read_bytes:
            return _("This run used “{weights}” weights, a format this story cannot count; "
                     "the Quantization page measures every variant it knows.").format(
                weights=self.weights)
        own, other, other_bytes = label(self.weights), label(self.other), self.bytes_of(self.other)
        less = self.other == "q4_0"
        ratio = self.read_bytes / other_bytes if less else other_bytes / self.read_bytes
        kind = ("measured" if self.measured_bytes is not None
                else "float_copy" if self.float_copy else "formula")
        line = _(_READ_LINES[kind, less]).format(
            own=own, other=other, read=size(self.read_bytes),
            formula=size(self.bytes_of(self.weights)), other_read=size(other_bytes), ratio=ratio)
        if not self.decode_steps or self.itl_median_ms is None:
            return sentences(line, _("This run stopped after its first token, so it had no decode "
                                     "step to time."))
        rate = self.read_bytes / self.itl_median_ms / 1e6  # bytes per ms → GB/s
        if less:
            speed = _("At its median ITL of {itl:.1f} ms that is {rate:.1f} GB/s of weights (bytes "
                      "per step ÷ ITL): decode waits on memory, so {other} would raise the ceiling "
                      "on its speed {ratio:.1f}×.")
        else:
            speed = _("At its median ITL of {itl:.1f} ms that is {rate:.1f} GB/s of weights (bytes "
                      "per step ÷ ITL).")
        return sentences(line, speed.format(itl=self.itl_median_ms, rate=rate, other=other,
                                            ratio=ratio))


def run_weights(trace: Trace) -> str:
    """The weights a run decoded with: its record's variant (the dtype's for traces from before
    the record), or `GGUF` for a GGUF file's own blocks (recorded as loaded: fp32)."""
    spec, record = trace.model, trace.decoder
    weights = record.weights if record is not None else FLOAT_WEIGHTS.get(spec.dtype, spec.dtype)
    return GGUF if weights == "fp32" and spec.stored_bits is not None else weights


def weights_notice(trace: Trace) -> WeightsNotice:
    spec = trace.model
    record = trace.decoder
    weights = run_weights(trace)
    formats = STORY_FORMATS + (() if weights in STORY_FORMATS else (weights,))
    counted = []
    for name in formats:
        try:
            counted.append(step_bytes(spec, name))
        except ValueError:  # a variant the calculator does not know: the line says so
            counted.append(0.0)
    native = record is not None and record.name == "native"
    return WeightsNotice(weights, formats, tuple(counted), record.name if record else None,
                         record.weight_bytes if native else None,
                         summarize(trace).itl_p50_ms if trace.speculation is None
                         else forward_median_ms(trace), len(trace.decode_forwards))
